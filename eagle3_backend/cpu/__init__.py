"""CPU serving path: real SGLang EAGLE-3 on a machine without a GPU.

SGLang's CPU engine calls ``sgl_kernel`` ops that the PyPI wheel only ships
for CUDA. This subpackage supplies torch implementations of those ops
(``eagle3_backend.cpu.ops``), a stand-in ``sgl_kernel`` module that exposes
them, and an SGLang platform plugin (``eagle3_backend.cpu.entry.activate``,
registered under the ``sglang.srt.platforms`` entry point) that installs both
before SGLang imports ``sgl_kernel``.

Nothing here is imported by ``import eagle3_backend``; sglang is imported
lazily, only by ``platform.py``.
"""
