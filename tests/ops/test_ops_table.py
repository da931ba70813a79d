"""eagle3_backend/ops/table.py names every op's files, and every kernel file has an op.

The mirror ops/ - ops/triton/ - csrc/ - tests/ops/ - benchmarks/ is complete:
each op has its module, Triton kernel, CUDA kernel, test file and benchmark,
and no file in those places is left without an op.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_backend import ops
from eagle3_backend.ops import _ext
from eagle3_backend.ops.table import BINDINGS, CUDA_SOURCES, OPS

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "eagle3_backend" / "ops"
# Files that serve every op rather than one.
SHARED = {"__init__.py", "_dispatch.py", "_ext.py", "reference.py", "table.py", "resources.py"}
SHARED_TESTS = {"test_ops_table.py", "test_csrc_compile.py", "test_triton_resources.py"}


def test_every_op_has_each_of_its_files():
    for op in OPS:
        for path in (PKG / op.module, PKG / "triton" / op.triton, ROOT / "csrc" / op.cuda,
                     ROOT / "tests" / "ops" / op.test, ROOT / "benchmarks" / op.bench,
                     ROOT / "tests" / "ops" / f"test_{op.bench}"):
            assert path.is_file(), f"{op.name}: {path.relative_to(ROOT)} is missing"
        assert callable(getattr(ops, op.name)), f"eagle3_backend.ops.{op.name} is not exported"


def test_no_kernel_file_is_left_without_an_op():
    owned = {
        "ops": {op.module for op in OPS}, "triton": {op.triton for op in OPS},
        "csrc": set(CUDA_SOURCES), "tests": {op.test for op in OPS} | {f"test_{op.bench}" for op in OPS},
    }
    found = {
        "ops": {p.name for p in PKG.glob("*.py")}, "triton": {p.name for p in (PKG / "triton").glob("*.py")},
        "csrc": {p.name for p in (ROOT / "csrc").glob("*.c*")},
        "tests": {p.name for p in (ROOT / "tests" / "ops").glob("test_*.py")},
    }
    for where in owned:
        extra = found[where] - owned[where] - SHARED - SHARED_TESTS
        assert not extra, f"{where}: {sorted(extra)} belong to no op of eagle3_backend/ops/table.py"
    assert CUDA_SOURCES[-1] == BINDINGS and _ext.CUDA_SOURCES == CUDA_SOURCES
    assert ops.OPS == tuple(op.name for op in OPS) == _ext.OP_NAMES


def test_setup_py_compiles_the_table_sources():
    scope = {"__file__": str(ROOT / "setup.py")}
    exec((ROOT / "setup.py").read_text().split('if __name__ == "__main__"')[0], scope)
    assert scope["_cuda_sources"]() == [f"csrc/{name}" for name in CUDA_SOURCES]
