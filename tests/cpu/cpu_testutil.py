"""Helpers shared by the CPU-tier tests (imported as a module: tests/cpu is on sys.path)."""

from __future__ import annotations

import torch


def assert_close_report(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float,
                        what: str) -> None:
    """assert_close that names the first mismatching index and both values."""
    actual = actual.double()
    expected = expected.double()
    bad = ~torch.isclose(actual, expected, atol=atol, rtol=rtol)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements differ; first at {idx}: "
            f"got {actual[idx].item():.6g}, expected {expected[idx].item():.6g} "
            f"(atol={atol}, rtol={rtol})")
