"""Fixtures of the verifier tests.

* ``smol_target``: the bundled SmolLM2-135M-Instruct GGUF loaded once per session in
  fp32 (about 20 s; every identity test shares it).
* ``tiny_target_dir`` (tests/conftest.py): an 8-layer random Llama HF model dir with the
  SmolLM2 tokenizer (chat template included): loads in about a second, for CLI / eval runs.
* one torch thread per test: on a loaded 2-core machine two OpenMP threads spin
  against each other and a 135M forward goes from 0.1 s to several seconds.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def smol_target(bundled_gguf):
    from eagle3_backend.verify.targets import load_target

    torch.set_num_threads(1)
    return load_target(bundled_gguf, "float32", "cpu")


@pytest.fixture
def make_tiny_draft():
    """Factory: ``make_tiny_draft(target_hidden, vocab, layout, seed=..., ...)``."""
    return _tiny_draft_model


def _tiny_draft_model(target_hidden: int, vocab: int, layout: str, *, seed: int = 0,
                     draft_vocab: int = 1024, dtype: str = "float32", hidden: int = 64):
    """A seeded random Eagle3DraftModel for a target of the given hidden size / vocab."""
    from eagle3_backend.config import DraftConfig
    from eagle3_backend.model import Eagle3DraftModel

    cfg = DraftConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, draft_vocab_size=draft_vocab,
                      target_hidden_size=target_hidden, layout=layout, dtype=dtype,
                      max_position_embeddings=2048)
    return Eagle3DraftModel.init_random(cfg, seed=seed).eval()
