"""What `eagle3 inspect` shows (what `eagle3 validate` checks is :mod:`.suite`)."""

from __future__ import annotations

from typing import Any

from eagle3_backend.checkpoint.loaded import LoadedDraft


def inspect_report(loaded: LoadedDraft) -> dict[str, Any]:
    """A JSON-ready description of a loaded draft."""
    cfg = loaded.config
    fc = loaded.state_dict.get("fc.weight")
    return {
        "path": loaded.path,
        "format": loaded.format,
        "layout": cfg.layout.to_strings(),
        "layout_source": loaded.layout_source,
        "layout_explanation": loaded.layout_explanation,
        "target_hidden_size": cfg.target_hidden_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "fc_in_features": int(fc.shape[1]) if fc is not None and fc.dim() == 2 else None,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_vocab_size": cfg.vocab_size,
        "has_d2t": loaded.has_d2t,
        "has_embed_tokens": cfg.has_embed_tokens,
        "dtype": cfg.dtype,
        "num_parameters": loaded.num_parameters,
        "target": {"architecture": loaded.target_architecture,
                   "num_hidden_layers": loaded.target_num_layers},
        "sglang_ids": list(loaded.sglang_ids) if loaded.sglang_ids is not None else None,
        "variants": {
            "fc_bias": cfg.fc_bias, "norm_before_fc": cfg.norm_before_fc,
            "fc_norm": cfg.fc_norm, "norm_before_residual": cfg.norm_before_residual,
            "norm_output": cfg.norm_output, "tie_word_embeddings": cfg.tie_word_embeddings,
            "rope_scaling": cfg.rope_scaling.to_dict() if cfg.rope_scaling else None,
        },
        "warnings": list(loaded.warnings),
    }
