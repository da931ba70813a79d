"""Triton kernels of eagle3_backend.ops (imported lazily: triton is optional).

One module per op: ``capture_into`` (the fc input written at capture time),
``verify_tree`` (greedy tree verification); ``resources`` compiles a
config for sm_120 / sm_90 without a GPU and reads its shared memory, registers
and spills.
"""
