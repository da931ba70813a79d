"""A small randomly initialised draft for a target (``eagle3 make-demo-draft``, ``make demo``).

The draft has the target's hidden size and attention shape, SGLang's default
layout for the target's layer count, the first ``draft_vocab_size`` target ids
as its vocabulary (BPE ids are roughly ordered by merge frequency) and the
target's own token embedding (dequantized from a GGUF, or read from a HF
safetensors model dir). It drafts nonsense but is shaped exactly like a real
draft, so every loader, converter and the serving path can run on it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from eagle3_backend.checkpoint.loaded import LoadedDraft
from eagle3_backend.checkpoint.write import save_sglang, to_layer_order
from eagle3_backend.config import DraftConfig
from eagle3_backend.errors import TargetError
from eagle3_backend.layout import Layout
from eagle3_backend.target import TargetInfo, language_model_name

logger = logging.getLogger(__name__)


def demo_config(target: TargetInfo, draft_vocab_size: int = 8192, dtype: str = "bfloat16",
                has_embed_tokens: bool = True, layout: Layout | None = None) -> DraftConfig:
    heads = target.num_attention_heads
    if heads is None:
        raise TargetError(f"{target.source}: the target does not record num_attention_heads; "
                          f"a demo draft copies the target's attention shape. Use a target "
                          f"config.json or GGUF that records it.")
    return DraftConfig(
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size or 4 * target.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=target.num_key_value_heads or heads,
        head_dim=target.head_dim,
        vocab_size=target.vocab_size,
        draft_vocab_size=min(draft_vocab_size, target.vocab_size),
        target_hidden_size=target.hidden_size,
        layout=layout or Layout.engine_default("sglang", target.num_hidden_layers,
                                               target.architecture),
        rms_norm_eps=target.rms_norm_eps or 1e-6,
        rope_theta=target.rope_theta or 10000.0,
        max_position_embeddings=target.max_position_embeddings or 2048,
        has_embed_tokens=has_embed_tokens,
        dtype=dtype,
    )


def target_embedding(target: TargetInfo) -> torch.Tensor | None:
    """The target's token embedding [vocab, hidden] in fp32, or None if not readable here."""
    src = Path(target.source)
    if target.source_format == "gguf":
        import gguf
        from gguf.quants import dequantize

        reader = gguf.GGUFReader(str(src), "r")
        for t in reader.tensors:
            if t.name == "token_embd.weight":
                w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
                return w.reshape(target.vocab_size, target.hidden_size)  # [V, H]
        return None
    from safetensors import safe_open

    for path in sorted(src.parent.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if (name in ("model.embed_tokens.weight", "embed_tokens.weight")
                        or language_model_name(name) == "model.embed_tokens.weight"):
                    return f.get_tensor(name).float()
    return None


def build_demo_draft(target: TargetInfo, seed: int = 0, draft_vocab_size: int = 8192,
                     dtype: str = "bfloat16", layout: Layout | None = None) -> LoadedDraft:
    from eagle3_backend.model import Eagle3DraftModel

    embed = target_embedding(target)
    cfg = demo_config(target, draft_vocab_size, dtype, has_embed_tokens=embed is not None,
                      layout=layout)
    model = Eagle3DraftModel.init_random(cfg, seed=seed)
    model.set_vocab_map(torch.arange(cfg.draft_vocab_size))
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if embed is not None:
        sd["embed_tokens.weight"] = embed.to(cfg.torch_dtype)
    how = "the target's embedding" if embed is not None else "no embedding (taken from the target)"
    return LoadedDraft(
        path="<demo>", format="sglang", config=cfg, state_dict=sd,
        layout_source="explicit",
        layout_explanation=(f"demo draft: layout {cfg.layout} given" if layout else
                            f"demo draft: SGLang's default layout for {target.num_hidden_layers} "
                            f"layers = {cfg.layout}") + f", {how}",
        target_architecture=target.architecture, target_num_layers=target.num_hidden_layers,
    )


def make_demo_draft(out: str | os.PathLike[str], target: TargetInfo, seed: int = 0,
                    draft_vocab_size: int = 8192, dtype: str = "bfloat16",
                    force: bool = False, layout: Layout | None = None) -> tuple[Path, LoadedDraft]:
    """Write the demo draft; returns it as written (SGLang format: its layout in layer order)."""
    draft = build_demo_draft(target, seed, draft_vocab_size, dtype, layout)
    return save_sglang(draft, out, target=target, force=force), to_layer_order(draft)
