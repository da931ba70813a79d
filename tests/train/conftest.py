"""Fixtures of the training tests.

* ``tiny_target_dir``: a 4-layer random Llama (hidden 64) saved as a HF model dir with
  the bundled SmolLM2 tokenizer (chat template included); the tokenizer is read from
  the GGUF once per session (about 10 s), the model loads in about a second.
* ``tiny_target``: that dir loaded with :func:`eagle3_backend.verify.targets.load_target`.
* one torch thread per test: on a loaded 2-core machine two threads spin against each other.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY_LAYERS = 4
TINY_HIDDEN = 64


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, bundled_gguf) -> Path:
    """HF model dir: LlamaForCausalLM, 4 layers, hidden 64, SmolLM2's vocab and tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("train-tiny-target")
    tok = AutoTokenizer.from_pretrained(str(bundled_gguf.parent), gguf_file=bundled_gguf.name)
    cfg = LlamaConfig(
        vocab_size=49152, hidden_size=TINY_HIDDEN, intermediate_size=128,
        num_hidden_layers=TINY_LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from eagle3_backend.verify.targets import load_target

    return load_target(tiny_target_dir, "float32", "cpu")
