"""The real trained draft the doctor tests share (session fixtures ``doctor_prompts_file``
and ``doctor_draft`` in tests/conftest.py): SmolLM2-135M, 12 prompts, 300 steps, about
a minute on one CPU core, trained once per test session."""

from __future__ import annotations

import json
from pathlib import Path

TRAINED = "[layer_input:2, layer_input:15, layer_input:27]"
# The fc slots trained on layers 2, 15, 27 labelled 15, 27, 2: a list-order mix-up.
MISLABEL = "[layer_input:15, layer_input:27, layer_input:2]"
PROMPTS = ["What is the capital of France?", "Explain photosynthesis briefly.",
           "Write a haiku about rain.", "Give three tips for studying.", "What is a prime number?",
           "Describe a cat in two sentences.", "How do airplanes fly?", "Name four planets.",
           "What is machine learning?", "Why is the sky blue?", "Suggest a name for a dog.",
           "How do I boil an egg?"]
NEW_TOKENS = 32


def write_prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in PROMPTS), encoding="utf-8")
    return path


def train(out: Path, prompts_file: Path) -> Path:
    from eagle3_backend.cli import main

    rc = main(["train", "--target", "bundled", "--dataset", str(prompts_file), "--out", str(out),
               "--layout", TRAINED, "--num-prompts", str(len(PROMPTS)), "--max-new-tokens",
               str(NEW_TOKENS), "--steps", "300", "--draft-vocab", "1024", "--batch-tokens", "256",
               "--heldout-fraction", "0.1", "--dtype", "float32", "--threads", "2", "--no-progress"])
    assert rc == 0
    return out


def mislabel(src: Path, dst: Path, layout: str = MISLABEL) -> Path:
    """``eagle3 convert --layout``: the same weights with their fc slots relabelled."""
    from eagle3_backend.cli import main

    assert main(["convert", str(src), str(dst), "--to", "sglang", "--layout", layout]) == 0
    return dst
