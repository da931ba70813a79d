"""Fixtures of the training tests.

* ``tiny_target_dir``: the small Llama of eagle3_backend.cpu.tiny_targets at 4 layers,
  hidden 64, lm_head tied to the embedding, with the bundled SmolLM2 tokenizer (chat
  template included); the tokenizer is read from the GGUF once per session (about 10 s),
  the model loads in about a second.
* ``tiny_target``: that dir loaded with :func:`eagle3_backend.verify.targets.load_target`.
* one torch thread per test: on a loaded 2-core machine two threads spin against each other.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_LAYERS = 4
TINY_HIDDEN = 64


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """HF model dir: LlamaForCausalLM, 4 layers, hidden 64, tied, SmolLM2's vocab and tokenizer."""
    from eagle3_backend.cpu.tiny_targets import write_target

    return write_target("llama", tmp_path_factory.mktemp("train-tiny-target"),
                        hidden_size=TINY_HIDDEN, layers=TINY_LAYERS, tied=True)


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from eagle3_backend.verify.targets import load_target

    return load_target(tiny_target_dir, "float32", "cpu")
