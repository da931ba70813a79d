"""Detect a draft checkpoint's format and read it into a :class:`LoadedDraft`.

Layout precedence (docs/design.md, "The bug class this project exists to end"):

1. ``explicit``: this package's ``eagle3_layout`` key in config.json;
2. ``engine-ids``: the engine's layer ids, translated by :mod:`eagle3_backend.layout`
   (SGLang ids need the target architecture: recorded ``eagle3_target``, else the
   ``target`` given to :func:`load_draft`);
3. ``assumed-default``: the engine's default for the target's layer count, always
   reported as an assumption in ``warnings``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from eagle3_backend.checkpoint.checks import check_tensors, stock_sglang_ids
from eagle3_backend.checkpoint.config_fields import (
    Fields,
    build_draft_config,
    config_dtype,
    tensor_dtype,
)
from eagle3_backend.checkpoint.files import checkpoint_dir, read_config, read_tensors
from eagle3_backend.checkpoint.loaded import LoadedDraft
from eagle3_backend.checkpoint.names import (
    DRAFT_ARCHS,
    SERVED_DRAFT_ARCHS,
    to_canonical,
    upper_layer,
)
from eagle3_backend.errors import CheckpointError, Finding, LayoutError, LayoutMismatch
from eagle3_backend.layout import Layout, sglang_id_rule
from eagle3_backend.target import TargetInfo

logger = logging.getLogger(__name__)

ID_CONVENTIONS = ("sglang", "specforge")


def detect_format(raw: Mapping[str, Any], where: str) -> str:
    """'sglang', 'vllm', 'speculators' or 'eagle-repo' from a draft config.json."""
    archs = raw.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    known = {DRAFT_ARCHS[a] for a in archs if a in DRAFT_ARCHS}
    spec_type = raw.get("speculators_model_type")
    if spec_type is not None or "speculators" in known:
        if spec_type != "eagle3":
            raise CheckpointError(
                f"{where}: speculators_model_type is {spec_type!r}; expected 'eagle3'. Only "
                f"EAGLE-3 drafts are supported (EAGLE-1/HASS drafts have no fc over target layers)."
            )
        return "speculators"
    if None in known:
        raise CheckpointError(
            f"{where}: architectures {archs} is an MLA-attention EAGLE-3 draft; expected "
            f"{list(SERVED_DRAFT_ARCHS)} (a Llama-style draft layer), the only kind this backend "
            f"implements. Serve this draft with stock SGLang."
        )
    if known:
        return "sglang" if "sglang" in known else "vllm"
    other = [a for a in archs if "eagle" in str(a).lower()]
    if other:
        raise CheckpointError(
            f"{where}: architectures {archs} name a draft model class this backend does not "
            f"implement (neither SGLang 0.5.23 nor vLLM has {other[0]!r}); expected "
            f"{[a for a, f in DRAFT_ARCHS.items() if f in ('sglang', 'vllm')]} (a Llama-style "
            f"EAGLE-3 draft layer) or ['Eagle3Speculator']. Re-export the draft as a Llama EAGLE-3 draft, or serve "
            f"it with the engine it was trained for."
        )
    if isinstance(raw.get("eagle_config"), dict):
        return "sglang"
    if "LlamaForCausalLM" in archs and raw.get("num_hidden_layers", 1) == 1:
        return "eagle-repo"
    raise CheckpointError(
        f"{where}: architectures {archs!r} is not an EAGLE-3 draft; expected "
        f"['LlamaForCausalLMEagle3'] (SGLang/SpecForge), ['Eagle3LlamaForCausalLM'] (vLLM/"
        f"AngelSlim), ['Eagle3Speculator'] with "
        f"speculators_model_type 'eagle3' (speculators), or a one-layer ['LlamaForCausalLM'] "
        f"with draft_vocab_size (EAGLE repo). Point at the draft checkpoint, not the target."
    )


@dataclass(frozen=True, slots=True)
class _Resolved:
    layout: Layout
    source: str
    explanation: str
    warnings: tuple[str, ...] = ()


def _recorded_target(f: Fields) -> tuple[str | None, int | None]:
    rec = f.dict("eagle3_target")
    if rec is None:
        return None, None
    sub = Fields(rec, f.where, "eagle3_target.")
    return sub.str("architecture"), sub.int("num_hidden_layers", None)


def _explicit(f: Fields) -> Layout | None:
    value = f.raw.get("eagle3_layout")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(
            f"{f.where}: field 'eagle3_layout' is {value!r}; expected a list of canonical "
            f"sources such as [\"embed\", \"layer_input:3\"]. Fix config.json."
        )
    try:
        return Layout.parse(value)
    except LayoutError as exc:
        raise CheckpointError(f"{f.where}: field 'eagle3_layout': {exc}") from None


def _need_layers(where: str, what: str, num_layers: int | None) -> int:
    if num_layers is None:
        raise CheckpointError(
            f"{where}: {what}; its layout is the engine default for the target's layer count, "
            f"which the checkpoint does not record (no 'eagle3_target'). Pass the target with "
            f"--target (HF config.json, model dir or GGUF) so the assumed layout can be computed "
            f"and reported, or add \"eagle3_layout\" to config.json."
        )
    return num_layers


def _assumed_default(f: Fields, engine: str, num_layers: int | None, missing: str,
                     assumed: str) -> _Resolved:
    """``engine``'s default layout for the target's layer count, for a checkpoint that
    records no layer ids (``missing`` says so in the error without a layer count); the
    explanation, also its warning, starts with ``assumed``."""
    L = _need_layers(f.where, missing, num_layers)
    layout = Layout.engine_default(engine, L)
    msg = (f"{assumed} default for a {L}-layer target, inputs of layers 2, L//2, L-3 = "
           f"{layout}; right only if the draft was trained with the default")
    return _Resolved(layout, "assumed-default", msg, (msg,))


def _resolve_sglang(f: Fields, arch: str | None, num_layers: int | None,
                    ids_as: str) -> _Resolved:
    eagle = f.dict("eagle_config") or {}
    ids = Fields(eagle, f.where, "eagle_config.").int_list("eagle_aux_hidden_state_layer_ids")
    if ids is None and f.raw.get("eagle_aux_hidden_state_layer_ids") is not None:
        raise CheckpointError(
            f"{f.where}: has a top-level 'eagle_aux_hidden_state_layer_ids' "
            f"{f.raw['eagle_aux_hidden_state_layer_ids']!r} but no "
            f"eagle_config.eagle_aux_hidden_state_layer_ids; SGLang 0.5.23 reads only the nested "
            f"ids and would silently capture its default layers. Move the ids into "
            f"\"eagle_config\" (or add \"eagle3_layout\")."
        )
    if ids is None:
        return _assumed_default(f, "sglang", num_layers, "records no layer ids (eagle_config."
                                "eagle_aux_hidden_state_layer_ids)",
                                "no layer ids recorded: assumed SGLang's")

    specforge = Layout.from_specforge_ids(ids)
    if ids_as == "specforge":
        return _Resolved(specforge, "engine-ids",
                         f"eagle_config ids {ids} read as SpecForge ids (output of layer k, list "
                         f"order, as --ids-as specforge asked) = {specforge}")
    notes: list[str] = []
    if arch is None:
        # The llama/qwen rule (+1) is also SpecForge's meaning for ascending ids.
        rule_arch, how = "llama", ("target architecture unknown (no eagle3_target, no --target):"
                                   " read with SGLang's llama/qwen rule (id k = output of layer "
                                   "k)")
        if ids[0] != 1:
            notes.append(f"eagle_config ids {ids} would mean a different layout on DeepSeek/"
                         f"Kimi targets (SGLang's deepseek_v2 rule adds +1 only when ids[0] == 1);"
                         f" pass --target to read them for the real target")
    else:
        rule_arch, how = arch, f"read as SGLang 0.5.23 ids for {arch}"
    try:
        sglang_id_rule(rule_arch)
    except LayoutError as exc:
        raise CheckpointError(f"{f.where}: {exc}") from None
    L = num_layers if num_layers is not None else max(ids) + 2  # range checked by validate
    if sglang_id_rule(rule_arch) == "gpt_oss" and num_layers is None:
        L = _need_layers(f.where, f"eagle_config ids {ids} on gpt-oss depend on the layer count",
                         num_layers)
    try:
        layout = Layout.from_sglang_ids(ids, rule_arch, L)
    except LayoutError as exc:
        raise CheckpointError(f"{f.where}: eagle_config.eagle_aux_hidden_state_layer_ids: {exc}"
                              ) from None
    if ids != sorted(ids):
        notes.append(f"eagle_config ids {ids} are not ascending: SGLang concatenates captured "
                     f"states in layer order ({layout}), SpecForge trains in list order "
                     f"({specforge}); if the draft was trained by SpecForge, re-read it with "
                     f"--ids-as specforge")
    elif layout != specforge:
        notes.append(f"eagle_config ids {ids} mean {layout} to SGLang on "
                     f"{arch or 'this target'} but {specforge} to SpecForge (output of layer k); "
                     f"if SpecForge trained the draft, re-read it with --ids-as specforge")
    return _Resolved(layout, "engine-ids", f"eagle_config ids {ids} {how} = {layout}",
                     tuple(notes))


def _input_of_layer_ids(f: Fields, ids: list[int]) -> Layout:
    """Top-level eagle_aux_hidden_state_layer_ids as speculators and vLLM read them (id k =
    input of layer k)."""
    try:
        return Layout.from_speculators_ids(ids)
    except LayoutError as exc:
        raise CheckpointError(f"{f.where}: eagle_aux_hidden_state_layer_ids: {exc}") from None


def _resolve_speculators(f: Fields, num_layers: int | None) -> _Resolved:
    ids = f.int_list("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        state = "null" if "eagle_aux_hidden_state_layer_ids" in f.raw else "absent"
        return _assumed_default(f, "speculators", num_layers, "records eagle_aux_hidden_state_"
                                f"layer_ids {state} (speculators' own converter drops them)",
                                f"eagle_aux_hidden_state_layer_ids is {state}: assumed the "
                                "speculators/vLLM")
    layout = _input_of_layer_ids(f, ids)
    notes = []
    if ids != sorted(ids):
        notes.append(f"speculators ids {ids} are not ascending: vLLM concatenates in layer order,"
                     f" the speculators trainer in list order; read in list order ({layout})")
    return _Resolved(layout, "engine-ids",
                     f"top-level ids {ids} read as speculators/vLLM ids (input of layer k) = "
                     f"{layout}", tuple(notes))


def _resolve_vllm(f: Fields, arch: str | None, num_layers: int | None,
                  ids_as: str) -> _Resolved:
    """``Eagle3LlamaForCausalLM`` configs: vLLM reads only the top-level ids (input of layer
    k); nested eagle_config ids (SGLang's) are read as SGLang would and flagged."""
    ids = f.int_list("eagle_aux_hidden_state_layer_ids")
    nested = Fields(f.dict("eagle_config") or {}, f.where,
                    "eagle_config.").int_list("eagle_aux_hidden_state_layer_ids")
    if ids is None and nested is not None:
        resolved = _resolve_sglang(f, arch, num_layers, ids_as)
        note = (f"architectures Eagle3LlamaForCausalLM (vLLM's name) with only nested "
                f"eagle_config ids {nested}: read as SGLang ids; vLLM reads only a top-level "
                f"eagle_aux_hidden_state_layer_ids and would capture its default layers")
        return _Resolved(resolved.layout, resolved.source, resolved.explanation,
                         resolved.warnings + (note,))
    if ids is None:
        return _assumed_default(f, "vllm", num_layers, "records no layer ids "
                                "(eagle_aux_hidden_state_layer_ids)",
                                "no layer ids recorded: assumed the vLLM/SGLang")
    layout = _input_of_layer_ids(f, ids)
    notes = []
    if nested is not None and nested != ids:
        notes.append(f"top-level ids {ids} (vLLM) and eagle_config ids {nested} (SGLang) are "
                     f"both recorded; read the top-level ones, as vLLM does")
    return _Resolved(layout, "engine-ids",
                     f"top-level ids {ids} read as vLLM ids (input of layer k) = {layout}",
                     tuple(notes))


def _resolve_eagle_repo(f: Fields, num_layers: int | None) -> _Resolved:
    L = _need_layers(f.where, "is an EAGLE-repo checkpoint, which records no layer ids",
                     num_layers)
    layout = Layout.engine_default("eagle", L)
    msg = (f"EAGLE-repo checkpoint: no layer ids recorded; assumed the EAGLE repo's hard-coded "
           f"inputs of layers 2, L//2, L-3 for a {L}-layer target = {layout}")
    return _Resolved(layout, "assumed-default", msg, (msg,))


def load_draft(
    path: str | os.PathLike[str],
    target: TargetInfo | None = None,
    *,
    allow_pickle: bool = False,
    strict: bool = True,
    ids_as: str = "sglang",
) -> LoadedDraft:
    """Read any supported draft checkpoint directory.

    ``target`` supplies the architecture and layer count a checkpoint does not
    record. ``ids_as`` ("sglang" or "specforge") says how to read SGLang-format
    ``eagle_config`` ids (they coincide for llama/qwen targets with ascending ids).
    With ``strict`` (the default) any problem with the tensors raises
    :class:`CheckpointError` listing all of them; otherwise they are returned in
    ``LoadedDraft.problems``.
    """
    if ids_as not in ID_CONVENTIONS:
        raise CheckpointError(f"ids_as {ids_as!r} is not one of {ID_CONVENTIONS}.")
    ckpt = checkpoint_dir(path)
    where = str(ckpt / "config.json")
    raw = read_config(ckpt)
    fmt = detect_format(raw, where)
    top = Fields(raw, where)
    tensors_raw, files = read_tensors(ckpt, allow_pickle=allow_pickle)
    weights_where = f"{ckpt}/{files[0]}" if len(files) == 1 else f"{ckpt} ({', '.join(files)})"
    tensors, notes = to_canonical(tensors_raw, weights_where)
    warnings: list[str] = list(notes)
    _refuse_qk_norm(tensors_raw, raw, weights_where)
    tensors, notes = _upper_layer_norms(tensors, fmt, weights_where)
    warnings += notes

    rec_arch, rec_layers = _recorded_target(top)
    if fmt == "speculators":
        verifier = Fields(top.dict("speculators_config") or {}, where, "speculators_config.")
        v_archs = Fields(verifier.dict("verifier") or {}, where,
                         "speculators_config.verifier.").str_list("architectures")
        rec_arch = rec_arch or (v_archs[0] if v_archs else None)
    arch = rec_arch or (target.architecture if target else None)
    num_layers = rec_layers or (target.num_hidden_layers if target else None)

    explicit = _explicit(top)
    sglang_ids = None
    if fmt == "sglang":
        eagle = top.dict("eagle_config") or {}
        ids = Fields(eagle, where, "eagle_config.").int_list("eagle_aux_hidden_state_layer_ids")
        sglang_ids = tuple(ids) if ids is not None else None
    if explicit is not None:
        resolved = _Resolved(explicit, "explicit", f"config.json eagle3_layout = {explicit}")
    elif fmt == "sglang":
        resolved = _resolve_sglang(top, arch, num_layers, ids_as)
    elif fmt == "vllm":
        resolved = _resolve_vllm(top, arch, num_layers, ids_as)
    elif fmt == "speculators":
        resolved = _resolve_speculators(top, num_layers)
    else:
        resolved = _resolve_eagle_repo(top, num_layers)
    warnings += resolved.warnings

    dtype, dnotes = tensor_dtype(tensors, weights_where)
    declared, cnotes = config_dtype(raw, where)
    warnings += dnotes + cnotes
    if declared is not None and declared != dtype:
        warnings.append(f"{where}: config declares dtype {declared} but the weights are {dtype}; "
                        f"the weights' dtype is kept")

    arch_fields = top
    if fmt == "speculators":
        tl = top.dict("transformer_layer_config")
        if tl is None:
            raise CheckpointError(
                f"{where}: speculators config has no 'transformer_layer_config'; expected the "
                f"draft layer's Llama config there. Re-export the draft with speculators."
            )
        arch_fields = Fields(tl, where, "transformer_layer_config.")
        if "norm_before_residual" not in raw:
            warnings.append(f"{where}: norm_before_residual is not recorded; read as false "
                            f"(speculators' default; vLLM assumes true when it is missing)")
    config = build_draft_config(
        arch=arch_fields, flags=top,
        eagle_config=top.dict("eagle_config") if fmt in ("sglang", "vllm") else None,
        layout=resolved.layout, has_embed_tokens="embed_tokens.weight" in tensors,
        dtype=dtype, where=where,
    )
    if fmt == "sglang" and config.norm_before_residual:
        warnings.append("norm_before_residual is true, which SGLang 0.5.23's llama_eagle3 "
                        "ignores (it keeps the un-normed residual): stock SGLang serves a "
                        "different model; serve it through the eagle3_backend plugin")

    tensors, vnotes = _fill_vocab_map(config, tensors)
    warnings += vnotes
    problems = check_tensors(config, tensors, weights_where)
    if fmt in ("sglang", "vllm"):
        problems += _uses_aux(top, config)
    if strict and explicit is not None and fmt == "sglang" and sglang_ids is not None and arch:
        # served right by the plugin (a note of the check suite), refused on a strict read
        problems += stock_sglang_ids(explicit, list(sglang_ids), arch, num_layers, where)
    if problems and strict:
        raise CheckpointError(_join(problems))
    for w in warnings:
        logger.warning("%s", w)
    return LoadedDraft(
        path=str(ckpt), format=fmt, config=config, state_dict=tensors,
        layout_source=resolved.source, layout_explanation=resolved.explanation,
        target_architecture=arch, target_num_layers=num_layers, sglang_ids=sglang_ids,
        stored_names=tuple(tensors_raw), warnings=tuple(warnings), problems=tuple(problems),
        raw_config=raw,
    )


def _refuse_qk_norm(tensors: Mapping[str, torch.Tensor], raw: Mapping[str, Any],
                    where: str) -> None:
    """A Qwen3 draft layer (speculators ``transformer_layer_config.model_type: qwen3``)
    normalises q and k per head; the Llama draft layer here and in SGLang has no such norm."""
    qk = sorted(n for n in tensors if n.endswith(("self_attn.q_norm.weight",
                                                  "self_attn.k_norm.weight")))
    if not qk:
        return
    layer = raw.get("transformer_layer_config")
    kind = layer.get("model_type") if isinstance(layer, Mapping) else raw.get("model_type")
    raise CheckpointError(
        f"{where}: tensors {qk} are per-head q/k norms of a Qwen3-style draft layer (model_type "
        f"{kind!r}); expected a Llama draft layer, the only kind this backend implements. "
        f"SGLang 0.5.23's LlamaForCausalLMEagle3 would drop them without a word and serve a "
        f"different model, so do not strip them: serve this draft with vLLM/speculators."
    )


def _upper_layer_norms(tensors: dict[str, torch.Tensor], fmt: str, where: str
                       ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Name the input norm of layers 1+ (``layers.N.*``, N >= 1) as SGLang does.

    SGLang 0.5.23's ``llama_eagle3`` normalises the input of layers 1+ with
    ``layers.N.hidden_norm`` and never reads their ``input_layernorm``; speculators and
    vLLM make layers 1+ plain Llama layers normalised by ``input_layernorm``. Those are
    renamed to ``hidden_norm`` here (and back by the speculators writer); an SGLang-format
    checkpoint keeps its names, an unused ``input_layernorm`` next to ``hidden_norm`` is
    dropped with a note, and one without ``hidden_norm`` is refused: stock SGLang would
    run those layers on a norm left at its initial ones, a different model.
    """
    upper = sorted({k for n in tensors if (k := upper_layer(n)) is not None})
    notes: list[str] = []
    out = dict(tensors)
    for n in upper:
        inp, hid = f"layers.{n}.input_layernorm.weight", f"layers.{n}.hidden_norm.weight"
        if inp not in out:
            continue
        if fmt in ("speculators", "vllm"):
            if hid in out:
                raise CheckpointError(
                    f"{where}: layer {n} has both input_layernorm and hidden_norm; a {fmt} draft's "
                    f"layers 1+ have one input norm (input_layernorm). Remove the extra tensor."
                )
            out[hid] = out.pop(inp)
        elif hid in out:
            del out[inp]
            notes.append(f"dropped {inp}: SGLang 0.5.23 normalises layer {n}'s input with "
                         f"{hid} and never reads it")
        else:
            raise CheckpointError(
                f"{where}: layer {n} normalises its input with input_layernorm and has no "
                f"hidden_norm, the speculators / vLLM convention in an SGLang-format checkpoint; "
                f"SGLang 0.5.23 normalises layers 1+ with hidden_norm, so it would serve this "
                f"layer with an untrained norm, a different model. If the draft was trained that "
                f"way, rename the tensor to layers.{n}.hidden_norm.weight."
            )
    return out, notes


def _fill_vocab_map(config, tensors: dict[str, torch.Tensor]
                    ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Add identity d2t/t2d for a full-vocabulary draft, t2d derived from d2t if absent."""
    notes: list[str] = []
    Vd, V = config.draft_vocab_size, config.vocab_size
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None and t2d is None and Vd == V:
        tensors = dict(tensors)
        tensors["d2t"] = torch.zeros(Vd, dtype=torch.int64)
        tensors["t2d"] = torch.ones(V, dtype=torch.bool)
        notes.append("no d2t/t2d: the draft vocabulary is the full target vocabulary "
                     "(identity map added)")
    elif d2t is not None and t2d is None and tuple(d2t.shape) == (Vd,) \
            and not d2t.dtype.is_floating_point:
        ids = torch.arange(Vd, dtype=torch.int64) + d2t.to(torch.int64)
        if bool(((ids >= 0) & (ids < V)).all()):
            tensors = dict(tensors)
            t2d = torch.zeros(V, dtype=torch.bool)
            t2d[ids] = True
            tensors["t2d"] = t2d
            notes.append("no t2d: derived from d2t (SGLang reads only d2t)")
    return tensors, notes


def _uses_aux(f: Fields, config) -> list[Finding]:
    """SGLang skips the fc when eagle_config.use_aux_hidden_state is false."""
    eagle = Fields(f.dict("eagle_config") or {}, f.where, "eagle_config.")
    if eagle.bool("use_aux_hidden_state", True):
        return []
    return [Finding(
        "use-aux-hidden-state", f"{f.where}: eagle_config.use_aux_hidden_state is",
        f"false, but the draft's fc reads {len(config.layout)} target hidden states "
        f"{config.layout}", "true", "With false, SGLang captures no hidden states, skips the fc "
        "and feeds the draft the target's last hidden state (acceptance length ~1.0, no error). "
        "Set \"use_aux_hidden_state\": true in eagle_config.", error=LayoutMismatch)]


def _join(problems: list[Finding]) -> str:
    if len(problems) == 1:
        return str(problems[0])
    return f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
