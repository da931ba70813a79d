"""Strict checks of a draft's tensors against its config.

Every tensor must be consumed, every expected tensor present (the names and
shapes of ``Eagle3DraftModel(config).state_dict()``, with ``embed_tokens``
optional), the vocabulary maps consistent and every weight finite. Each check
returns messages instead of raising, so ``eagle3 validate`` can list them all.
"""

from __future__ import annotations

from typing import Mapping

import torch

from eagle3_backend.checkpoint.names import upper_layer
from eagle3_backend.config import DraftConfig


def expected_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint for ``config`` must hold."""
    from eagle3_backend.model import Eagle3DraftModel

    with torch.device("meta"):
        model = Eagle3DraftModel(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def check_tensors(config: DraftConfig, tensors: Mapping[str, torch.Tensor], where: str) -> list[str]:
    """Every problem with ``tensors`` as the weights of ``config`` (empty if none)."""
    problems: list[str] = []
    expected = expected_shapes(config)

    # a layer past the first counts when it has attention (a stray tensor stays "unknown")
    held = 1 + len({k for n in tensors if n.endswith(".self_attn.q_proj.weight")
                    and (k := upper_layer(n)) is not None})
    if held != config.num_hidden_layers:
        problems.append(
            f"{where}: config.json says num_hidden_layers {config.num_hidden_layers}, but the "
            f"weights hold {held} decoder layer(s) (midlayer.*"
            f"{f' and layers.1..{held - 1}.*' if held > 1 else ''}); expected them equal. Set "
            f"num_hidden_layers to {held} (a value like 30 is the target's layer count)."
        )
        # the per-tensor lists below would only repeat this, layer by layer
        expected = {n: v for n, v in expected.items() if upper_layer(n) is None}
        tensors = {n: v for n, v in tensors.items() if upper_layer(n) is None}

    missing = [n for n in expected if n not in tensors]
    if missing == ["lm_head.weight"] and config.draft_vocab_size == config.vocab_size:
        problems.append(
            f"{where}: missing tensor 'lm_head.weight' of a full-vocabulary draft "
            f"(draft_vocab_size {config.draft_vocab_size} = vocab_size); expected it in the "
            f"checkpoint. Such a draft shares the target's lm_head (SGLang loads it from the "
            f"target when draft_vocab_size is null), which this backend does not do: copy the "
            f"target's lm_head.weight [{config.vocab_size}, {config.hidden_size}] into the draft."
        )
    elif missing:
        problems.append(
            f"{where}: missing tensor(s) {missing}; a draft with this config.json needs them "
            f"(names as in SGLang's EAGLE-3 checkpoints). Re-export the complete state dict."
        )
    unknown = sorted(n for n in tensors if n not in expected)
    if unknown:
        problems.append(
            f"{where}: unknown tensor(s) {unknown}; expected only {sorted(expected)}. Unknown "
            f"weights are never skipped silently (SGLang would drop them without a word): fix "
            f"the config.json flags that create them (fc_norm, bias, norm_before_fc, "
            f"tie_word_embeddings, num_hidden_layers) or remove them."
        )
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None or tuple(t.shape) == shape:
            continue
        if name == "fc.weight":
            problems.append(
                f"{where}: fc.weight has shape {_shape(t)}; expected [{config.hidden_size}, "
                f"{config.fc_in_features}] = [hidden_size, {len(config.layout)} layout sources "
                f"{config.layout} x target_hidden_size {config.target_hidden_size}]. The "
                f"config's layout or target_hidden_size does not match the weights; record the "
                f"layout the draft was trained with."
            )
        else:
            problems.append(
                f"{where}: tensor {name!r} has shape {_shape(t)}; expected {list(shape)} from "
                f"config.json (hidden_size {config.hidden_size}, vocab_size {config.vocab_size}, "
                f"draft_vocab_size {config.draft_vocab_size}, target_hidden_size "
                f"{config.target_hidden_size}). Fix config.json to describe these weights."
            )

    for name, t in tensors.items():
        if name in ("d2t", "t2d") or not t.is_floating_point():
            if name not in ("d2t", "t2d") and name in expected:
                problems.append(
                    f"{where}: tensor {name!r} has dtype {t.dtype}; expected a floating-point "
                    f"weight. Re-export the draft."
                )
            continue
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            n_nan = int(torch.isnan(t).sum())
            n_inf = int(bad.sum()) - n_nan
            problems.append(
                f"{where}: tensor {name!r} holds {n_nan} NaN and {n_inf} Inf value(s) out of "
                f"{t.numel()}; expected finite weights. The training run diverged or the file is "
                f"corrupt; export an earlier checkpoint."
            )

    problems += check_vocab_map(config, tensors.get("d2t"), tensors.get("t2d"), where,
                                config.vocab_size)
    return problems


def check_vocab_map(config: DraftConfig, d2t: torch.Tensor | None, t2d: torch.Tensor | None,
                    where: str, vocab: int, vocab_what: str = "vocab_size") -> list[str]:
    """d2t in range (``0 <= i + d2t[i] < vocab``), distinct, and t2d consistent with it."""
    problems: list[str] = []
    Vd = config.draft_vocab_size
    if d2t is None or tuple(d2t.shape) != (Vd,):
        return problems  # reported as missing / wrong shape already
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        problems.append(
            f"{where}: d2t has dtype {d2t.dtype}; expected an integer tensor of offsets "
            f"(target id = i + d2t[i]). Re-export the vocabulary map as int64."
        )
        return problems
    target_ids = torch.arange(Vd, dtype=torch.int64) + d2t.to(torch.int64)
    out = (target_ids < 0) | (target_ids >= vocab)
    if bool(out.any()):
        bad = torch.nonzero(out).flatten()
        i = int(bad[0])
        problems.append(
            f"{where}: d2t maps {bad.numel()} draft id(s) outside the target vocabulary "
            f"[0, {vocab}) ({vocab_what}); first: draft id {i} -> {i} + d2t[{i}] = "
            f"{int(target_ids[i])}. The vocabulary map belongs to another target or is stored "
            f"as absolute ids instead of offsets; rebuild it from the target's tokenizer."
        )
        return problems
    distinct = int(torch.unique(target_ids).numel())
    if distinct != Vd:
        problems.append(
            f"{where}: d2t maps {Vd} draft ids onto only {distinct} distinct target ids; "
            f"expected a one-to-one map. Rebuild the vocabulary map."
        )
    if t2d is None or tuple(t2d.shape) != (config.vocab_size,):
        return problems
    if t2d.dtype.is_floating_point:
        problems.append(
            f"{where}: t2d has dtype {t2d.dtype}; expected bool (or 0/1 integers). Re-export it."
        )
        return problems
    if t2d.dtype != torch.bool and bool(((t2d != 0) & (t2d != 1)).any()):
        problems.append(f"{where}: t2d holds values other than 0/1; expected a boolean mask.")
        return problems
    mask = t2d.to(torch.bool)
    covered = int(mask.sum())
    if covered != Vd:
        problems.append(
            f"{where}: t2d marks {covered} target ids; expected draft_vocab_size {Vd} "
            f"(t2d must be true exactly at the targets of d2t). d2t and t2d disagree: one of "
            f"them is stale or reversed; rebuild both from the same vocabulary."
        )
    elif distinct == Vd and not bool(mask[target_ids].all()):
        missing = int((~mask[target_ids]).sum())
        problems.append(
            f"{where}: t2d is false at {missing} target id(s) that d2t maps to (i + d2t[i]); "
            f"expected t2d[i + d2t[i]] true for every draft id. d2t and t2d disagree: rebuild "
            f"both from the same vocabulary."
        )
    return problems
