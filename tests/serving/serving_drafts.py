"""Tiny EAGLE-3 draft checkpoints and target descriptions for the serving tests.

Every draft is written the way SGLang 0.5.23 reads one (config.json with
``architectures: [LlamaForCausalLMEagle3]`` + model.safetensors with SGLang's
tensor names), seeded, with one named defect at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eagle3_backend.errors import LayoutError
from eagle3_backend.layout import Layout
from eagle3_backend.target import TargetInfo

HIDDEN = 64  # draft and target hidden size
VOCAB = 49152  # SmolLM2's tokenizer
DRAFT_VOCAB = 1024
TARGET_LAYERS = 8
HEADS, KV_HEADS, HEAD_DIM, FFN = 4, 2, 16, 128


def tiny_target(architecture: str = "LlamaForCausalLM", layers: int = TARGET_LAYERS) -> TargetInfo:
    return TargetInfo(architecture=architecture, model_type="llama", num_hidden_layers=layers,
                      hidden_size=HIDDEN, vocab_size=VOCAB, source="tiny-target")


def write_draft(path: Path, *, layout: list[str] | None = ("embed", "layer_input:2", "layer_input:5"),
                ids: list[int] | None = None, fc_in: int | None = None, vocab: int = VOCAB,
                d2t_shift: int = 0, rename: dict[str, str] | None = None,
                drop: tuple[str, ...] = (), extra: dict[str, torch.Tensor] | None = None,
                config_extra: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """Write a draft; ``layout=None`` records no eagle3_layout, ``ids`` the eagle_config ids.

    fc_in: fc input width (default len(layout or ids or 3) x HIDDEN); d2t_shift is added to
    every d2t offset (pushes draft ids outside the target vocabulary when large); rename maps
    stored tensor names to other names (a renamed tensor SGLang would skip); drop leaves
    tensors out, extra adds some.
    """
    path.mkdir(parents=True, exist_ok=True)
    k = len(layout) if layout is not None else (len(ids) if ids is not None else 3)
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": vocab, "draft_vocab_size": DRAFT_VOCAB, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "float32",
        "target_hidden_size": HIDDEN, "hidden_act": "silu", "rope_theta": 10000.0,
    }
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids),
                                  "use_aux_hidden_state": True}
    elif layout is not None:
        # the ids stock SGLang would read on the tiny llama target (the plugin captures the layout)
        try:
            stock = Layout.parse(list(layout)).to_sglang_ids("LlamaForCausalLM", TARGET_LAYERS)
        except LayoutError:
            stock = list(range(k))
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": stock,
                                  "use_aux_hidden_state": True}
    if layout is not None:
        config["eagle3_layout"] = list(layout)
    config.update(config_extra or {})
    (path / "config.json").write_text(json.dumps(config, indent=1))

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    hot = torch.randperm(vocab, generator=g)[:DRAFT_VOCAB].sort().values  # target ids of draft ids
    d2t = hot - torch.arange(DRAFT_VOCAB) + d2t_shift
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    tensors = {
        "fc.weight": rnd(HIDDEN, fc_in if fc_in is not None else k * HIDDEN),
        "midlayer.self_attn.q_proj.weight": rnd(q, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": rnd(kv, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": rnd(kv, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": rnd(HIDDEN, q),
        "midlayer.mlp.gate_proj.weight": rnd(FFN, HIDDEN),
        "midlayer.mlp.up_proj.weight": rnd(FFN, HIDDEN),
        "midlayer.mlp.down_proj.weight": rnd(HIDDEN, FFN),
        "midlayer.input_layernorm.weight": torch.ones(HIDDEN),
        "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": torch.ones(HIDDEN),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": rnd(DRAFT_VOCAB, HIDDEN),
        "d2t": d2t.to(torch.int64),
        "t2d": t2d,
    }
    for old, new in (rename or {}).items():
        tensors[new] = tensors.pop(old)
    tensors = {n: t for n, t in tensors.items() if n not in drop} | (extra or {})
    save_file(tensors, str(path / "model.safetensors"))
    return path

