"""Torch implementations of the ``sgl_kernel`` CPU ops SGLang's CPU engine and its
EAGLE worker call (attention, KV-slot bookkeeping, draft tree build and greedy
verify), registered as ``torch.ops.sgl_kernel.*`` by ``registry.register_all``.
Plain-loop references for the tests live in ``reference.py``.
"""
