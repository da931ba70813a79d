"""What `eagle3 inspect` shows and what `eagle3 validate` checks against a target."""

from __future__ import annotations

from typing import Any

from eagle3_backend.checkpoint.checks import check_vocab_map
from eagle3_backend.checkpoint.loaded import LoadedDraft
from eagle3_backend.errors import LayoutError
from eagle3_backend.layout import Layout
from eagle3_backend.target import TargetInfo


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


def validate_against_target(loaded: LoadedDraft, target: TargetInfo) -> tuple[list[str], list[str]]:
    """(problems, notes) of serving ``loaded`` on ``target``; no problems = servable."""
    cfg = loaded.config
    where = loaded.path
    problems: list[str] = list(loaded.problems)
    notes: list[str] = []
    t = target.source

    if cfg.target_hidden_size != target.hidden_size:
        problems.append(
            f"{where}: draft target_hidden_size is {cfg.target_hidden_size} but target {t} has "
            f"hidden_size {target.hidden_size}; expected equal. The draft was trained for a "
            f"different target."
        )
    fc = loaded.state_dict.get("fc.weight")
    want = len(cfg.layout) * target.hidden_size
    if fc is not None and fc.dim() == 2 and fc.shape[1] != want:
        problems.append(
            f"{where}: fc.weight takes {fc.shape[1]} inputs; expected layout {cfg.layout} "
            f"({len(cfg.layout)} sources) x target hidden_size {target.hidden_size} = {want}. "
            f"The layout or the target is wrong for these weights."
        )
    try:
        cfg.layout.check_range(target.num_hidden_layers)
    except LayoutError as exc:
        problems.append(f"{where}: {exc}")
    if cfg.vocab_size != target.vocab_size:
        problems.append(
            f"{where}: draft vocab_size (target vocabulary) is {cfg.vocab_size} but target {t} "
            f"has vocab_size {target.vocab_size}; expected equal. The draft's embedding and "
            f"vocabulary map belong to another tokenizer."
        )
    d2t = loaded.state_dict.get("d2t")
    if d2t is not None and target.vocab_size < cfg.vocab_size:
        problems += check_vocab_map(cfg, d2t, None, where, target.vocab_size,
                                    vocab_what=f"target {t} vocab_size")
    if loaded.target_architecture is not None and (
            loaded.target_architecture != target.architecture):
        problems.append(
            f"{where}: records target architecture {loaded.target_architecture} but target {t} "
            f"is {target.architecture}; expected the same. The draft was made for another model."
        )
    if loaded.target_num_layers is not None and (
            loaded.target_num_layers != target.num_hidden_layers):
        problems.append(
            f"{where}: records a target with {loaded.target_num_layers} layers but target {t} "
            f"has {target.num_hidden_layers}; expected the same. The draft was made for another "
            f"model."
        )
    problems += _stock_sglang(loaded, target)
    if target.max_position_embeddings and cfg.max_position_embeddings < target.max_position_embeddings:
        notes.append(
            f"draft max_position_embeddings {cfg.max_position_embeddings} is below the target's "
            f"{target.max_position_embeddings}: SGLang stops at start-up unless --context-length "
            f"<= {cfg.max_position_embeddings} is given"
        )
    if loaded.format != "sglang":
        notes.append(f"{loaded.format} format: stock SGLang does not load it; write an SGLang "
                     f"checkpoint with `eagle3 convert {where} DST --to sglang`")
    try:
        sorted_layout, _ = cfg.layout.sorted_order()
        sorted_layout.to_sglang_ids(target.architecture, target.num_hidden_layers)
    except LayoutError as exc:
        if not any(str(cfg.layout) in p for p in problems):
            notes.append(f"stock SGLang cannot capture layout {cfg.layout} on "
                         f"{target.architecture}; serve it through the eagle3_backend plugin "
                         f"({exc})")
    notes += list(loaded.warnings)
    return problems, notes


def _stock_sglang(loaded: LoadedDraft, target: TargetInfo) -> list[str]:
    """Stock SGLang reads eagle_config ids: they must give the draft's layout on this target."""
    if loaded.sglang_ids is None or loaded.layout_source != "explicit":
        return []
    ids = list(loaded.sglang_ids)
    try:
        served = Layout.from_sglang_ids(ids, target.architecture, target.num_hidden_layers)
    except LayoutError as exc:
        return [f"{loaded.path}: eagle_config ids {ids} cannot be served by stock SGLang on "
                f"{target.architecture}: {exc}"]
    if served == loaded.layout:
        return []
    return [
        f"{loaded.path}: eagle_config ids {ids} make stock SGLang capture {served} on "
        f"{target.architecture} ({target.num_hidden_layers} layers), but the draft was trained "
        f"on {loaded.layout}; expected them equal. Rewrite it for this target with "
        f"`eagle3 convert SRC DST --to sglang --target {target.source}`."
    ]
