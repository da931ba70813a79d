"""Every op of eagle3_backend.ops and the files it lives in: the one table that the
package (``OPS``), the extension loader (``_ext``), setup.py, tests/ops and docs read.

Plain Python with no imports, so setup.py reads it without torch.
"""

from __future__ import annotations

from typing import NamedTuple


class Op(NamedTuple):
    name: str    # eagle3_backend.ops.<name> and torch.ops.eagle3.<name>
    module: str  # eagle3_backend/ops/<module>.py: checks and dispatch
    triton: str  # eagle3_backend/ops/triton/<triton>.py
    cuda: str    # csrc/<cuda>
    test: str    # tests/ops/<test>
    bench: str   # benchmarks/<bench>


OPS: tuple[Op, ...] = (
    Op("capture_into", "capture_into.py", "capture_into.py", "capture_into.cu",
       "test_capture_into.py", "bench_capture_into.py"),
    Op("verify_tree_greedy", "verify_tree.py", "verify_tree.py", "verify_tree_greedy.cu",
       "test_verify_tree.py", "bench_verify_tree.py"),
)
OP_NAMES: tuple[str, ...] = tuple(op.name for op in OPS)
#: The torch.library bindings of every CUDA kernel (TORCH_LIBRARY(eagle3, ...)).
BINDINGS = "ops.cpp"
#: What the extension compiles, relative to csrc/: each kernel file once, then the bindings.
CUDA_SOURCES: tuple[str, ...] = (*dict.fromkeys(op.cuda for op in OPS), BINDINGS)

