"""Write a :class:`LoadedDraft` as an SGLang-native or a speculators checkpoint.

Both writers keep the weights' dtype, store the canonical layout as
``eagle3_layout`` and the target as ``eagle3_target`` next to the ids the
engine reads, and put a layout that is not in ascending layer order into
layer order first (:func:`to_layer_order`): SGLang and vLLM concatenate the
captured states in layer order, so the fc weight's column blocks (and the
per-chunk ``fc_norm`` / ``input_norm`` weights) are permuted to match. The
result is an exactly equivalent draft.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from eagle3_backend.checkpoint.files import write_checkpoint
from eagle3_backend.checkpoint.loaded import LoadedDraft
from eagle3_backend.checkpoint.names import to_speculators_name
from eagle3_backend.errors import CheckpointError, LayoutError
from eagle3_backend.layout import Layout
from eagle3_backend.target import TargetInfo

logger = logging.getLogger(__name__)

SPECULATIVE_TOKENS = 3  # speculators' proposal default written for vLLM


def to_layer_order(loaded: LoadedDraft) -> LoadedDraft:
    """The same draft with its layout in ascending layer order (fc columns permuted)."""
    return to_layout(loaded, loaded.config.layout.sorted_order()[0])


def to_layout(loaded: LoadedDraft, layout: Layout) -> LoadedDraft:
    """The same draft with its fc input in ``layout``'s order (the same sources, permuted):
    fc weight column blocks, ``input_norm`` blocks and ``fc_norm`` slots follow the sources."""
    cfg = loaded.config
    if layout == cfg.layout:
        return loaded
    if sorted(layout.layers) != sorted(cfg.layout.layers):
        raise LayoutError(f"{loaded.path}: layout {cfg.layout} cannot be reordered into "
                          f"{layout}: {cfg.layout.describe_difference(layout)}.")
    perm = [cfg.layout.sources.index(src) for src in layout.sources]  # new slot i = old perm[i]
    Ht = cfg.target_hidden_size
    sd = dict(loaded.state_dict)

    def blocks(t: torch.Tensor) -> torch.Tensor:  # t: [..., K*Ht] -> chunks in the new order
        chunks = t.split(Ht, dim=-1)
        return torch.cat([chunks[p] for p in perm], dim=-1).contiguous()

    sd["fc.weight"] = blocks(sd["fc.weight"])  # [H, K*Ht]
    if cfg.norm_before_fc:
        sd["input_norm.weight"] = blocks(sd["input_norm.weight"])  # [K*Ht]
    if cfg.fc_norm:
        old = {i: sd[f"fc_norm.{i}.weight"] for i in range(len(perm))}
        for i, p in enumerate(perm):
            sd[f"fc_norm.{i}.weight"] = old[p]
    note = (f"layout {cfg.layout} rewritten as the equivalent draft with layout {layout} "
            f"(fc weight column blocks permuted {perm})")
    logger.info("%s", note)
    return dataclasses.replace(
        loaded, config=dataclasses.replace(cfg, layout=layout), state_dict=sd,
        warnings=loaded.warnings + (note,),
    )


def _target_of(loaded: LoadedDraft, target: TargetInfo | None, dst: Path) -> tuple[str, int]:
    arch = loaded.target_architecture or (target.architecture if target else None)
    layers = loaded.target_num_layers or (target.num_hidden_layers if target else None)
    if arch is None or layers is None:
        raise CheckpointError(
            f"{loaded.path}: the target is not recorded (architecture {arch!r}, "
            f"num_hidden_layers {layers!r}), and writing {dst} needs both to compute the "
            f"engine's layer ids. Pass --target (the target's config.json, model dir or GGUF)."
        )
    if target is not None and (target.architecture != arch or target.num_hidden_layers != layers):
        raise CheckpointError(
            f"{loaded.path}: records target {arch} with {layers} layers but --target "
            f"{target.source} is {target.architecture} with {target.num_hidden_layers} layers; "
            f"expected the same target. Use the target the draft was trained for."
        )
    return arch, layers


def _llama_fields(loaded: LoadedDraft) -> dict[str, Any]:
    cfg = loaded.config
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling.to_dict() if cfg.rope_scaling else None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    }


def sglang_config(loaded: LoadedDraft, arch: str, num_layers: int) -> dict[str, Any]:
    """config.json for SGLang 0.5.23 (layout must already be in layer order)."""
    cfg = loaded.config
    try:
        ids = cfg.layout.to_sglang_ids(arch, num_layers)
    except LayoutError as exc:
        raise CheckpointError(
            f"{loaded.path}: cannot express layout {cfg.layout} as SGLang ids for {arch} with "
            f"{num_layers} layers: {exc}"
        ) from None
    out: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}
    out.update(_llama_fields(loaded))
    out.update({
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "bias": cfg.fc_bias,
        "fc_norm": cfg.fc_norm,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_output": cfg.norm_output,
        "torch_dtype": cfg.dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": ids,
            "use_aux_hidden_state": True,
            "norm_before_fc": cfg.norm_before_fc,
        },
        "eagle3_layout": cfg.layout.to_strings(),
        "eagle3_target": {"architecture": arch, "num_hidden_layers": num_layers},
    })
    return out


def _sources(target: TargetInfo | None, sources: Sequence[str | os.PathLike[str]]) -> list[Any]:
    """Paths the destination must neither be nor hold: the given inputs and the target."""
    return [*sources, target.source if target is not None else None]


def save_sglang(loaded: LoadedDraft, dst: str | os.PathLike[str], *,
                target: TargetInfo | None = None, force: bool = False,
                sources: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Write an SGLang-native checkpoint (config.json + model.safetensors) to ``dst``.

    ``dst`` is checked before anything is written (:func:`check_destination`): it may not
    be or hold ``sources`` or the target, and ``force`` replaces only a checkpoint directory.
    """
    dst = Path(dst)
    arch, layers = _target_of(loaded, target, dst)
    ordered = to_layer_order(loaded)
    config = sglang_config(ordered, arch, layers)
    return write_checkpoint(dst, config, ordered.state_dict, force=force,
                            sources=_sources(target, sources))


def speculators_config(loaded: LoadedDraft, arch: str, num_layers: int,
                       verifier_path: str | None) -> dict[str, Any]:
    """config.json for speculators / vLLM (layout must already be in layer order)."""
    cfg = loaded.config
    unsupported = [name for name, on in (("fc_norm", cfg.fc_norm), ("bias (fc bias)", cfg.fc_bias),
                                         ("norm_output", cfg.norm_output),
                                         ("tie_word_embeddings", cfg.tie_word_embeddings)) if on]
    if unsupported:
        raise CheckpointError(
            f"{loaded.path}: the draft uses {unsupported}, which the speculators Eagle3 format "
            f"cannot express; expected none of them. Convert to SGLang format instead "
            f"(--to sglang)."
        )
    cfg.layout.check_range(num_layers)
    layer = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    layer.update(_llama_fields(loaded))
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "eagle_aux_hidden_state_layer_ids": cfg.layout.to_speculators_ids(),
        "torch_dtype": cfg.dtype,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{
                "proposal_type": "greedy",
                "speculative_tokens": SPECULATIVE_TOKENS,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }],
            "verifier": {"name_or_path": verifier_path, "architectures": [arch]},
        },
        "eagle3_layout": cfg.layout.to_strings(),
        "eagle3_target": {"architecture": arch, "num_hidden_layers": num_layers},
    }


def save_speculators(loaded: LoadedDraft, dst: str | os.PathLike[str], *,
                     target: TargetInfo | None = None, force: bool = False,
                     verifier_path: str | None = None,
                     sources: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Write a speculators (vLLM) Eagle3 checkpoint to ``dst``."""
    dst = Path(dst)
    arch, layers = _target_of(loaded, target, dst)
    ordered = to_layer_order(loaded)
    if verifier_path is None:
        spec = ordered.raw_config.get("speculators_config")
        verifier = spec.get("verifier") if isinstance(spec, dict) else None
        verifier_path = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if verifier_path is None and target is not None:
        verifier_path = target.source
    try:
        config = speculators_config(ordered, arch, layers, verifier_path)
    except LayoutError as exc:
        raise CheckpointError(f"{loaded.path}: {exc}") from None
    tensors = {to_speculators_name(k): v for k, v in ordered.state_dict.items()}
    return write_checkpoint(dst, config, tensors, force=force, sources=_sources(target, sources))
