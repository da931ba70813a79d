"""Helpers shared by the kernel tests (imported as a module: tests/ops is on sys.path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view)


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Same shape, dtype and bits (so -0.0 != 0.0); names the first mismatch."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = _bits(actual.cpu()), _bits(expected.cpu())
    if not torch.equal(a, e):
        bad = (a != e).nonzero()
        first = tuple(bad[0].tolist())
        raise AssertionError(
            f"{what}: {bad.shape[0]} of {a.numel()} elements differ; first at {first}: "
            f"got {actual.cpu()[first].item()!r}, expected {expected.cpu()[first].item()!r}"
        )


CPU_BACKENDS = ("torch", "triton")


def cuda_ready() -> bool:
    return torch.cuda.is_available()
