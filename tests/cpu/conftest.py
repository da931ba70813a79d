"""Fixtures of the CPU tier: registered ops, entry-point site, the converted SmolLM2 target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def sgl_ops():
    """torch.ops.sgl_kernel with this package's CPU ops registered."""
    from eagle3_backend.cpu.ops import registry

    registry.register_all()
    return torch.ops.sgl_kernel


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """A PYTHONPATH entry under which SGLang finds this package's declared entry points."""
    from eagle3_backend.cpu.launch import entry_point_site

    return entry_point_site(REPO / "pyproject.toml", tmp_path_factory.mktemp("plugin_site"))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as an HF dir SGLang loads (fp32), converted from the bundled GGUF.

    ``EAGLE3_CPU_TARGET_DIR`` names a dir to convert into (and reuse across runs).
    """
    from eagle3_backend.cpu.target_convert import convert_gguf_to_hf

    out = os.environ.get("EAGLE3_CPU_TARGET_DIR") or tmp_path_factory.mktemp("smollm2") / "target"
    return convert_gguf_to_hf(out)
