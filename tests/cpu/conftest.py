"""Fixtures of the CPU tier: registered ops, the converted SmolLM2 target (``plugin_site``: tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from eagle3_backend.target import TargetInfo


@pytest.fixture(scope="session")
def sgl_ops():
    """torch.ops.sgl_kernel with this package's CPU ops registered."""
    from eagle3_backend.cpu.ops import registry

    registry.register_all()
    return torch.ops.sgl_kernel


@pytest.fixture(scope="session")
def kernel():
    """The built module of the CPU kernels (few-row linear, paged attention, layer ops)."""
    from eagle3_backend.cpu import small_gemm

    mod = small_gemm.load()
    assert mod is not None, ("the CPU kernels did not build on this machine (see the log); "
                             "the CI machine has g++ and ninja, so this is a defect")
    return mod


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as an HF dir SGLang loads (fp32), converted from the bundled GGUF.

    ``EAGLE3_CPU_TARGET_DIR`` names a dir to convert into (and reuse across runs).
    """
    from eagle3_backend.cpu.target_convert import convert_gguf_to_hf

    out = os.environ.get("EAGLE3_CPU_TARGET_DIR") or tmp_path_factory.mktemp("smollm2") / "target"
    return convert_gguf_to_hf(out)


FAMILY_PROMPTS = 8
FAMILY_NEW_TOKENS = 24


@pytest.fixture(scope="session")
def family_prompts() -> dict[str, tuple[list[int], int]]:
    """8 seeded random-id prompts (6-19 tokens) and the new tokens each is asked for."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(FAMILY_PROMPTS):
        n = int(torch.randint(6, 20, (1,), generator=g))
        out[f"p{i}"] = (torch.randint(100, 40000, (n,), generator=g).tolist(), FAMILY_NEW_TOKENS)
    return out


@pytest.fixture(scope="session")
def family_target(tmp_path_factory):
    """family -> the small random target of that family (eagle3_backend.cpu.tiny_targets, echo
    0.35: its greedy output repeats in runs, where the echo draft is accepted), written once."""
    from eagle3_backend.cpu.tiny_targets import write_target

    root = tmp_path_factory.mktemp("families")
    return lambda family: write_target(family, root / family, echo=0.35)


@pytest.fixture(scope="session")
def family_reference(family_target, family_prompts, plugin_site, tmp_path_factory):
    """family -> the tp 1 target-only server's greedy outputs for family_prompts (one launch each)."""
    from cpu_testutil import family_spec, serve_prompts

    cache: dict[str, dict[str, dict]] = {}

    def get(family: str) -> dict[str, dict]:
        if family not in cache:
            log = tmp_path_factory.mktemp(f"{family}-srv") / "target_only.log"
            target = family_target(family)
            outs, text = serve_prompts(family_spec(target), plugin_site, log, family_prompts)
            arch = TargetInfo.from_path(target).architecture
            assert f"eagle3_backend.cpu platform: {arch} loaded" in text
            for name, out in outs.items():
                assert len(out["output_ids"]) == FAMILY_NEW_TOKENS, (name, out["meta_info"])
                assert "spec_accept_length" not in out["meta_info"]
            # the echo target repeats in runs, but not one token only: the comparison has content
            runs = [len(set(o["output_ids"])) for o in outs.values()]
            assert sum(r > 1 for r in runs) >= FAMILY_PROMPTS // 2, runs
            cache[family] = outs
        return cache[family]

    return get
