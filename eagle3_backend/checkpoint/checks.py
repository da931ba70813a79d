"""Strict checks of a draft's tensors against its config.

Every tensor must be consumed, every expected tensor present (the names and
shapes of ``Eagle3DraftModel(config).state_dict()``, with ``embed_tokens``
optional), the vocabulary maps consistent and every weight finite. Each check
returns findings (:class:`~eagle3_backend.errors.Finding`) instead of raising, so
``eagle3 validate`` can list them all.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from eagle3_backend.checkpoint.names import upper_layer
from eagle3_backend.config import DraftConfig
from eagle3_backend.errors import NOTE, Finding, LayoutError
from eagle3_backend.layout import Layout


def expected_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint for ``config`` must hold."""
    from eagle3_backend.model import Eagle3DraftModel

    with torch.device("meta"):
        model = Eagle3DraftModel(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def check_tensors(config: DraftConfig, tensors: Mapping[str, torch.Tensor],
                  where: str) -> list[Finding]:
    """Every problem with ``tensors`` as the weights of ``config`` (empty if none)."""
    problems: list[Finding] = []
    expected = expected_shapes(config)

    # a layer past the first counts when it has attention (a stray tensor stays "unknown")
    held = 1 + len({k for n in tensors if n.endswith(".self_attn.q_proj.weight")
                    and (k := upper_layer(n)) is not None})
    if held != config.num_hidden_layers:
        problems.append(Finding(
            "num-layers", f"{where}: config.json says num_hidden_layers "
            f"{config.num_hidden_layers}, but the weights hold",
            f"{held} decoder layer(s) (midlayer.*"
            f"{f' and layers.1..{held - 1}.*' if held > 1 else ''})", "them equal",
            f"Set num_hidden_layers to {held} (a value like 30 is the target's layer count)."))
        # the per-tensor lists below would only repeat this, layer by layer
        expected = {n: v for n, v in expected.items() if upper_layer(n) is None}
        tensors = {n: v for n, v in tensors.items() if upper_layer(n) is None}

    missing = [n for n in expected if n not in tensors]
    if missing == ["lm_head.weight"] and config.draft_vocab_size == config.vocab_size:
        problems.append(Finding(
            "missing-tensors", f"{where}: missing tensor",
            f"'lm_head.weight' of a full-vocabulary draft (draft_vocab_size "
            f"{config.draft_vocab_size} = vocab_size)", "it in the checkpoint",
            f"Such a draft shares the target's lm_head (SGLang loads it from the target when "
            f"draft_vocab_size is null), which this backend does not do: copy the target's "
            f"lm_head.weight [{config.vocab_size}, {config.hidden_size}] into the draft."))
    elif missing:
        problems.append(Finding(
            "missing-tensors", f"{where}: missing tensor(s)", missing,
            "every tensor a draft with this config.json has (names as in SGLang's EAGLE-3 "
            "checkpoints)", "Re-export the complete state dict."))
    unknown = sorted(n for n in tensors if n not in expected)
    if unknown:
        problems.append(Finding(
            "unknown-tensors", f"{where}: unknown tensor(s)", unknown, f"only {sorted(expected)}",
            "Unknown weights are never skipped silently (SGLang would drop them without a word): "
            "fix the config.json flags that create them (fc_norm, bias, norm_before_fc, "
            "tie_word_embeddings, num_hidden_layers) or remove them."))
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None or tuple(t.shape) == shape:
            continue
        if name == "fc.weight":
            problems.append(Finding(
                "fc-shape", f"{where}: fc.weight has shape", _shape(t),
                f"[{config.hidden_size}, {config.fc_in_features}] = [hidden_size, "
                f"{len(config.layout)} layout sources {config.layout} x target_hidden_size "
                f"{config.target_hidden_size}]",
                "The config's layout or target_hidden_size does not match the weights; record "
                "the layout the draft was trained with."))
        else:
            problems.append(Finding(
                "tensor-shape", f"{where}: tensor {name!r} has shape", _shape(t),
                f"{list(shape)} from config.json (hidden_size {config.hidden_size}, vocab_size "
                f"{config.vocab_size}, draft_vocab_size {config.draft_vocab_size}, "
                f"target_hidden_size {config.target_hidden_size})",
                "Fix config.json to describe these weights."))

    for name, t in tensors.items():
        if name in ("d2t", "t2d") or not t.is_floating_point():
            if name not in ("d2t", "t2d") and name in expected:
                problems.append(Finding("tensor-dtype", f"{where}: tensor {name!r} has dtype",
                                        t.dtype, "a floating-point weight", "Re-export the draft."))
            continue
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            n_nan = int(torch.isnan(t).sum())
            n_inf = int(bad.sum()) - n_nan
            problems.append(Finding(
                "finite", f"{where}: tensor {name!r} holds",
                f"{n_nan} NaN and {n_inf} Inf value(s) out of {t.numel()}", "finite weights",
                "The training run diverged or the file is corrupt; export an earlier checkpoint."))

    problems += check_vocab_map(config, tensors.get("d2t"), tensors.get("t2d"), where,
                                config.vocab_size)
    return problems


def check_vocab_map(config: DraftConfig, d2t: torch.Tensor | None, t2d: torch.Tensor | None,
                    where: str, vocab: int, vocab_what: str = "vocab_size") -> list[Finding]:
    """d2t in range (``0 <= i + d2t[i] < vocab``), distinct, and t2d consistent with it."""
    Vd = config.draft_vocab_size
    if d2t is None or tuple(d2t.shape) != (Vd,):
        return []  # reported as missing / wrong shape already

    def found(what: str, value: Any, expected: Any, fix: str = "") -> list[Finding]:
        return [Finding("vocab-map", f"{where}: {what}", value, expected, fix)]

    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        return found("d2t has dtype", d2t.dtype, "an integer tensor of offsets (target id = i + "
                     "d2t[i])", "Re-export the vocabulary map as int64.")
    target_ids = torch.arange(Vd, dtype=torch.int64) + d2t.to(torch.int64)
    out = (target_ids < 0) | (target_ids >= vocab)
    if bool(out.any()):
        bad = torch.nonzero(out).flatten()
        i = int(bad[0])
        return found(
            "d2t maps", f"{bad.numel()} draft id(s) outside the target vocabulary [0, {vocab}) "
            f"({vocab_what}); first: draft id {i} -> {i} + d2t[{i}] = {int(target_ids[i])}",
            f"every i + d2t[i] in [0, {vocab})", "The vocabulary map belongs to another target "
            "or is stored as absolute ids instead of offsets; rebuild it from the target's "
            "tokenizer.")
    problems: list[Finding] = []
    distinct = int(torch.unique(target_ids).numel())
    if distinct != Vd:
        problems += found("d2t maps", f"{Vd} draft ids onto only {distinct} distinct target ids",
                          "a one-to-one map", "Rebuild the vocabulary map.")
    if t2d is None or tuple(t2d.shape) != (config.vocab_size,):
        return problems
    if t2d.dtype.is_floating_point:
        return problems + found("t2d has dtype", t2d.dtype, "bool (or 0/1 integers)",
                                "Re-export it.")
    if t2d.dtype != torch.bool and bool(((t2d != 0) & (t2d != 1)).any()):
        return problems + found("t2d holds", "values other than 0/1", "a boolean mask")
    mask = t2d.to(torch.bool)
    covered = int(mask.sum())
    if covered != Vd:
        problems += found(
            "t2d marks", f"{covered} target ids", f"draft_vocab_size {Vd} (t2d must be true "
            f"exactly at the targets of d2t)", "d2t and t2d disagree: one of them is stale or "
            "reversed; rebuild both from the same vocabulary.")
    elif distinct == Vd and not bool(mask[target_ids].all()):
        missing = int((~mask[target_ids]).sum())
        problems += found(
            "t2d is", f"false at {missing} target id(s) that d2t maps to (i + d2t[i])",
            "t2d[i + d2t[i]] true for every draft id",
            "d2t and t2d disagree: rebuild both from the same vocabulary.")
    return problems


def stock_sglang_ids(layout: Layout, ids: list[int], arch: str, num_layers: int | None,
                     where: str) -> list[Finding]:
    """The eagle_config ids stock SGLang reads must capture the recorded layout (the plugin
    captures the layout whatever the ids; a strict read refuses them)."""
    L = num_layers if num_layers is not None else max(ids) + 2
    try:
        served = Layout.from_sglang_ids(ids, arch, L)
    except LayoutError as exc:
        return [Finding("stock-ids", f"{where}: eagle_config ids {ids} cannot be served by stock "
                        f"SGLang on", arch, None, str(exc), severity=NOTE)]
    if served == layout:
        return []
    return [Finding(
        "stock-ids", f"{where}: eagle3_layout is {layout} but eagle_config ids {ids} make",
        f"stock SGLang capture {served} on {arch} (in layer order)", "them to agree",
        "The eagle3_backend plugin serves the recorded layout; for stock SGLang rewrite the "
        "checkpoint with `eagle3 convert SRC DST --to sglang`, which writes matching ids "
        "(reordering fc columns when needed).", severity=NOTE)]
