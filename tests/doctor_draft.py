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


def with_second_layer(src: Path, dst: Path, hidden_norm: str = "random", seed: int = 0,
                      scale: float = 2.0) -> Path:
    """The trained draft plus a seeded random second decoder layer, SGLang format.

    Layer 1's o_proj / down_proj are scaled so that it moves the proposals without
    drowning the trained first layer (offline acceptance stays about 2.5 on PROMPTS).
    ``hidden_norm="random"``: its input norm weights are drawn from [0.2, 2.2]; ``"ones"``:
    left at ones, which is what SGLang serves when a checkpoint lacks the tensor.
    """
    import dataclasses

    import torch

    from eagle3_backend.checkpoint import load_draft
    from eagle3_backend.checkpoint.write import save_sglang

    d = load_draft(src)
    cfg = dataclasses.replace(d.config, num_hidden_layers=2)
    g = torch.Generator().manual_seed(seed)
    H, inter = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def rand(rows: int, cols: int, s: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) * s / cols ** 0.5

    p = "layers.1."
    sd = dict(d.state_dict)
    sd.update({p + "self_attn.q_proj.weight": rand(q, H), p + "self_attn.k_proj.weight": rand(kv, H),
               p + "self_attn.v_proj.weight": rand(kv, H), p + "self_attn.o_proj.weight": rand(H, q, scale),
               p + "mlp.gate_proj.weight": rand(inter, H), p + "mlp.up_proj.weight": rand(inter, H),
               p + "mlp.down_proj.weight": rand(H, inter, scale),
               p + "post_attention_layernorm.weight": torch.ones(H),
               p + "hidden_norm.weight": (0.2 + 2 * torch.rand(H, generator=g)
                                          if hidden_norm == "random" else torch.ones(H))})
    return save_sglang(dataclasses.replace(d, config=cfg, state_dict=sd), dst, force=True)
