"""Every op of eagle3_backend.ops and the files it lives in: the one table that the
package (``OPS``), the extension loader (``_ext``), setup.py, tests/ops and docs read,
and where the CUDA toolkit that compiles them is.

Standard library only, so setup.py reads it without torch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
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


def find_cuda_home() -> Path | None:
    """Toolkit root: $CUDA_HOME/$CUDA_PATH, else the one holding nvcc and cuda_runtime.h."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for home in candidates:
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return home
    return None
