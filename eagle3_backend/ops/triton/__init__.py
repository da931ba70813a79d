"""Triton kernels of eagle3_backend.ops (imported lazily: triton is optional).

One module per op: ``gather_concat`` (gather + concat, capture_into),
``verify_tree`` (greedy tree verification); ``resources`` compiles a
config for sm_120 / sm_90 without a GPU and reads its shared memory, registers
and spills.
"""
