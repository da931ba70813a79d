"""Fixtures for kernel tests: Triton runs under its interpreter on CPU tensors.

The Triton launchers build an InterpretedFunction for CPU tensors on first
use, whatever TRITON_INTERPRET was at import, so setting the variable per
test (it is what makes dispatch consider Triton for CPU tensors) is enough
and does not leak into other test directories.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _kernel_env(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("EAGLE3_KERNEL_BACKEND", raising=False)
    torch.manual_seed(0)
