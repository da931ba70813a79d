"""The real trained drafts the doctor tests share (session fixtures in tests/conftest.py),
SmolLM2-135M, 300 steps each, trained once per test session:

* ``doctor_draft`` on :data:`TRAINED` (the engines' default for 30 layers) over the 12
  :data:`PROMPTS`, about a minute on one CPU core (tests/cpu/test_cpu_doctor_serve.py);
* ``wide_draft`` on :data:`WIDE`, a layout no engine defaults to, over the first
  :data:`WIDE_PROMPTS` short single-turn ShareGPT prompts (``wide_prompts_file``), 48
  answer tokens each, as many as ``eagle3 doctor`` scores by default: enough prompts
  for the doctor's default budget, so its tests run it at its default settings.
"""

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
WIDE = "[layer_input:4, layer_input:11, layer_input:23]"
WIDE_PROMPTS = 80


def write_prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in PROMPTS), encoding="utf-8")
    return path


def write_wide_prompts(path: Path) -> Path:
    from eagle3_backend.verify.datasets import read_sharegpt

    texts = [p.messages[0][1] for p in read_sharegpt(limit=400)
             if len(p.messages) == 1 and 10 < len(p.messages[0][1]) < 300][:WIDE_PROMPTS]
    assert len(texts) == WIDE_PROMPTS
    path.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in texts), encoding="utf-8")
    return path


def train(out: Path, prompts_file: Path, layout: str = TRAINED, prompts: int = len(PROMPTS),
          new_tokens: int = NEW_TOKENS, draft_vocab: int = 1024) -> Path:
    from eagle3_backend.cli import main

    rc = main(["train", "--target", "bundled", "--dataset", str(prompts_file), "--out", str(out),
               "--layout", layout, "--num-prompts", str(prompts), "--max-new-tokens",
               str(new_tokens), "--steps", "300", "--draft-vocab", str(draft_vocab),
               "--batch-tokens", "256", "--heldout-fraction", "0.1", "--dtype", "float32",
               "--threads", "2", "--no-progress"])
    assert rc == 0
    return out


def train_wide(out: Path, prompts_file: Path) -> Path:
    return train(out, prompts_file, WIDE, WIDE_PROMPTS, 48, 2048)


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
