"""Can this draft be served on this target, and how: the one check suite.

``eagle3 validate`` (every finding), the SGLang plugin's pre-load refusals
(``serving.checks.check_launch``), ``eagle3 eval`` / ``eagle3 doctor``
(``verify.engine.attach_draft``: :func:`check_config`) and ``eagle3 convert --target``
(the checkpoint written) all ask this module and print the words of its findings
(:class:`~eagle3_backend.errors.Finding`). It models, without importing it, what SGLang
0.5.23 does with a draft: dispatch on ``architectures``; build fc from the config
(:func:`sglang_num_aux`); load tensors by name, skipping unknown ones without a word and
leaving unloaded parameters random (:func:`sglang_unconsumed`); map vocabularies with
d2t; capture the layout with the target's model file (``serving.capture.ServingPlan``);
verify a draft tree of the launch's size (:func:`check_args`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from eagle3_backend.checkpoint.checks import stock_sglang_ids
from eagle3_backend.checkpoint.names import DRAFT_ARCHS, SERVED_DRAFT_ARCHS
from eagle3_backend.config import DraftConfig
from eagle3_backend.errors import (
    ERROR,
    NOTE,
    CheckpointError,
    Eagle3Error,
    Finding,
    LayoutError,
    LayoutMismatch,
    ServingError,
)
from eagle3_backend.layout import Layout
from eagle3_backend.target import TargetInfo


@dataclass(frozen=True, slots=True)
class LaunchArgs:
    """The SGLang launch arguments the checks read (after SGLang's own resolution)."""

    algorithm: str | None  # resolved: NEXTN is already EAGLE
    draft_path: str | None
    pp_size: int = 1
    two_batch_overlap: bool = False
    num_steps: int | None = None  # --speculative-num-steps (None: not resolved, not checked)
    topk: int | None = None  # --speculative-eagle-topk
    num_draft_tokens: int | None = None  # --speculative-num-draft-tokens
    context_length: int | None = None  # --context-length (None: the target's own)

    def __post_init__(self) -> None:
        if self.algorithm is not None:
            object.__setattr__(self, "algorithm", str(self.algorithm).upper())


@dataclass(frozen=True, slots=True)
class Verdict:
    """The findings about one draft on one target, and the layout it is served with."""

    findings: tuple[Finding, ...]
    loaded: Any = None  # the LoadedDraft (None when it was not read)
    layout: Layout | None = None
    layout_source: str | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def notes(self) -> list[str]:
        """The note findings and what reading the draft assumed, in words."""
        warnings = list(self.loaded.warnings) if self.loaded is not None else []
        return [str(f) for f in self.findings if f.severity == NOTE] + warnings


def refusal(findings: Iterable[Finding], prefix: str = "", what: str = "") -> Eagle3Error | None:
    """The one exception stating every error among ``findings`` (None: there are none)."""
    errors = [f for f in findings if f.severity == ERROR]
    if not errors:
        return None
    head = f"{prefix}: " if prefix else ""
    if len(errors) == 1:
        return errors[0].error(f"{head}{errors[0]}")
    lines = "\n".join(f"  - {f}" for f in errors)
    return errors[0].error(f"{prefix or 'refused'} ({len(errors)} problems with {what}):\n{lines}")


# ---------------------------------------------------------------------- the whole suite
def judge(path: str | os.PathLike[str], target: TargetInfo, *, args: LaunchArgs | None = None,
          choose_layout: Callable[[Any], tuple[Layout, str]] | None = None,
          **load_options: Any) -> Verdict:
    """Every finding about serving the draft at ``path`` on ``target`` with launch ``args``.

    ``choose_layout(loaded)`` gives the layout to serve and its source (default: the one
    the draft records); ``load_options`` go to ``load_draft``. A draft that cannot be read
    raises its CheckpointError, unless its architectures already refuse it.
    """
    from eagle3_backend.checkpoint.files import checkpoint_dir, read_config
    from eagle3_backend.checkpoint.read import load_draft

    findings = check_args(args) if args is not None else []
    ckpt = checkpoint_dir(path)
    raw = read_config(ckpt)
    algorithm = args.algorithm if args is not None else "EAGLE3"
    findings += check_algorithm(algorithm, raw, ckpt)
    if algorithm != "EAGLE3":
        return Verdict(tuple(findings))
    architecture = _architectures(raw, ckpt)
    try:
        loaded = load_draft(ckpt, target=target, strict=False, **load_options)
    except CheckpointError:
        if architecture:
            return Verdict(tuple(findings + architecture))
        raise
    layout, source = (choose_layout(loaded) if choose_layout is not None
                      else (loaded.layout, loaded.layout_source))
    names = loaded.stored_names if loaded.format == "sglang" else None
    findings += architecture + check_draft(loaded, target, layout, names)
    findings += check_context(loaded, target, args)
    return Verdict(tuple(findings), loaded, layout, source)


#: SGLang's switch that lets a draft run past its own derived context length.
LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def check_context(loaded: Any, target: TargetInfo, args: LaunchArgs | None,
                  env: Mapping[str, str] | None = None) -> list[Finding]:
    """SGLang 0.5.23 gives the draft the server's context length (``--context-length``, else
    the target's derived one) and refuses to start when the draft's own derived length
    (:func:`eagle3_backend.target.sglang_context_length`) is shorter."""
    from eagle3_backend.target import sglang_context_length

    env = os.environ if env is None else env
    given = args.context_length if args is not None else None
    served = given if given is not None else target.context_length
    if not served:
        return []
    raw = loaded.raw_config if loaded.format == "sglang" and loaded.raw_config else {
        "max_position_embeddings": loaded.config.max_position_embeddings}
    own = sglang_context_length(raw)
    if own >= served:
        return []
    where = f"draft {loaded.path}"
    what = f"--context-length {given}" if given is not None else f"the target's context length {served}"
    if str(env.get(LONGER_CONTEXT_ENV, "")).lower() in ("1", "true"):
        return [Finding("context-length", f"{where}: its derived context length is", own,
                        f"at least {what}", f"{LONGER_CONTEXT_ENV} is set: SGLang raises the draft's "
                        f"max_position_embeddings to {served}; positions past {own} were never trained.",
                        severity=NOTE)]
    return [Finding(
        "context-length", f"{where}: its derived context length (max_position_embeddings, SGLang's "
        "rule) is", own, f"at least {what}", f"SGLang 0.5.23 refuses to start the draft. Launch "
        f"with --context-length {own} (or less), or set {LONGER_CONTEXT_ENV}=1 to run the draft "
        f"past its trained length, or record max_position_embeddings >= {served} in its config.json.")]


def check_draft(loaded: Any, target: TargetInfo, layout: Layout | None = None,
                names: Iterable[str] | None = None) -> list[Finding]:
    """Findings about a read draft served on ``target`` with ``layout`` (default: its own).

    ``names``: the tensor names as stored, for the model of SGLang's loader (None: not run).
    """
    cfg, raw = loaded.config, loaded.raw_config
    layout = layout if layout is not None else loaded.layout
    where, t = f"draft {loaded.path}", target.source
    config = check_config(cfg, target, where, layout)
    out = [f for f in config if f.check == "target-hidden-size"]  # widths first
    K, Ht = len(layout), target.hidden_size
    fc = loaded.state_dict.get("fc.weight")
    if fc is not None and fc.dim() == 2 and int(fc.shape[1]) != K * Ht:
        out.append(Finding(
            "fc-width", f"{where}: fc.weight takes", f"{int(fc.shape[1])} inputs",
            f"{K * Ht} = layout {layout} ({K} sources) x target {target.architecture} hidden "
            f"size {Ht}", "The layout or the target is wrong for these weights: re-export the "
            "draft with its training layout, or serve it on the target it was trained for.",
            error=LayoutMismatch))
    if loaded.format == "sglang" and sglang_num_aux(raw) != K:
        out.append(Finding(
            "sglang-fc-width", f"{where}: SGLang derives the fc input slots from config.json "
            f"(num_aux_hidden_states, else len(eagle_config.eagle_aux_hidden_state_layer_ids), "
            f"else 3):", sglang_num_aux(raw), f"{K}, the sources of layout {layout}",
            f"It would build fc {sglang_num_aux(raw)} x {Ht} wide. Rewrite the config with "
            f"`eagle3 convert`, or set \"num_aux_hidden_states\": {K}.", error=LayoutMismatch))
    out += [f for f in config if f.check != "target-hidden-size"] + _capture(layout, target, where)
    d2t = loaded.state_dict.get("d2t")
    if d2t is not None and target.vocab_size < cfg.vocab_size:
        from eagle3_backend.checkpoint.checks import check_vocab_map

        out += check_vocab_map(cfg, d2t, None, where, target.vocab_size,
                               vocab_what=f"target {t} vocab_size")
    for name, recorded, actual in (
            ("architecture", loaded.target_architecture, target.architecture),
            ("layer count", loaded.target_num_layers, target.num_hidden_layers)):
        if recorded is not None and recorded != actual:
            out.append(Finding(
                "recorded-target", f"{where}: records the target {name}", recorded,
                f"{actual}, that of target {t}", "The draft was made for another model."))
    problems = list(loaded.problems)
    if any(f.check == "fc-width" for f in out):  # the reader's fc shape, said of the target
        problems = [p for p in problems if p.check != "fc-shape"]
    if names is not None:
        loader = sglang_unconsumed(raw, names, K, where)
        if loader:  # the reader's missing/unknown tensors would repeat them in its names
            problems = [p for p in problems if p.check not in ("missing-tensors",
                                                               "unknown-tensors")]
        out += loader
    out += problems
    return out + _notes(loaded, target, layout, out)


def check_config(cfg: DraftConfig, target: TargetInfo, where: str = "draft",
                 layout: Layout | None = None) -> list[Finding]:
    """What a draft config must share with its target: widths, layers, vocabulary."""
    layout = layout if layout is not None else cfg.layout
    out: list[Finding] = []
    t, L = target.source, target.num_hidden_layers
    if cfg.target_hidden_size != target.hidden_size:
        out.append(Finding(
            "target-hidden-size", f"{where}: target_hidden_size is", cfg.target_hidden_size,
            f"{target.hidden_size}, the hidden size of target {t}", "SGLang builds the draft's "
            "fc from it; the draft was trained for another target.", error=LayoutMismatch))
    bad = [str(s) for s in layout.sources if s.layer > L]
    if bad:
        out.append(Finding(
            "layer-range", f"{where}: layout {layout} names", ", ".join(bad),
            f"sources of the target's {L} decoder layers (embed, layer_input:1 .. "
            f"layer_input:{L})", "The draft was trained for a different target; use a draft "
            "trained on this target.", error=LayoutError))
    if cfg.vocab_size != target.vocab_size:
        out.append(Finding(
            "vocab-size", f"{where}: vocab_size (the target vocabulary it predicts into) is",
            cfg.vocab_size, f"{target.vocab_size}, that of target {t}", "The draft's embedding "
            "and vocabulary map belong to another tokenizer."))
    return out


def _architectures(raw: Mapping[str, Any], ckpt: Path) -> list[Finding]:
    archs = raw.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    if any(a in SERVED_DRAFT_ARCHS for a in archs):
        return []
    if any(a in DRAFT_ARCHS and DRAFT_ARCHS[a] is None for a in archs):
        fix = ("SGLang 0.5.23 has that draft class, but this plugin does not check or serve it: "
               "serve it with stock SGLang (SGLANG_PLUGINS without 'eagle3').")
    else:
        fix = (f"Convert the draft with `eagle3 convert {ckpt} OUT --to sglang --target "
               f"<target>` and serve OUT.")
    return [Finding(
        "architectures", f"draft {ckpt} declares architectures", archs,
        f"{list(SERVED_DRAFT_ARCHS)}, the EAGLE-3 draft class SGLang 0.5.23 dispatches to and "
        f"the eagle3_backend plugin checks and serves", fix)]


def _capture(layout: Layout, target: TargetInfo, where: str) -> list[Finding]:
    """The target's SGLang model file must capture every source (``serving.capture``)."""
    from eagle3_backend.plan import ServingPlan

    arch, L = target.architecture, target.num_hidden_layers
    if any(s.layer > L for s in layout.sources):
        return []  # layer-range said it
    try:
        ServingPlan(layout=layout, architecture=arch, num_layers=L,
                    hidden_size=target.hidden_size, draft_path="-", layout_source="-")
    except Eagle3Error as exc:
        return [Finding("capture", f"{where}: layout {layout} on target", f"{arch} ({L} layers)",
                        "sources the eagle3_backend plugin has SGLang 0.5.23 capture there",
                        str(exc), error=type(exc))]
    return []


def _notes(loaded: Any, target: TargetInfo, layout: Layout, found: list[Finding]) -> list[Finding]:
    """What serving does that the user should know, though it serves the draft."""
    where, out = f"draft {loaded.path}", []
    if any(f.check in ("layer-range", "capture") for f in found):
        return out  # not served by the plugin either
    if loaded.format == "sglang" and loaded.sglang_ids is not None and loaded.layout_source == "explicit":
        out += stock_sglang_ids(layout, list(loaded.sglang_ids), target.architecture,
                                target.num_hidden_layers, where)
    try:
        layout.sorted_order()[0].to_sglang_ids(target.architecture, target.num_hidden_layers)
    except LayoutError as exc:
        out.append(Finding(
            "stock-capture", f"{where}: stock SGLang cannot capture layout", layout,
            None, f"Serve it through the eagle3_backend plugin ({exc})", severity=NOTE))
    return out


# ------------------------------------------------------------------------ launch flags
def check_args(args: LaunchArgs) -> list[Finding]:
    """The launch flags an EAGLE-3 launch cannot be served with (empty for other algorithms)."""
    if args.algorithm != "EAGLE3":
        return []
    out: list[Finding] = []
    if not args.draft_path:
        out.append(Finding(
            "draft-path", "--speculative-algorithm EAGLE3 without",
            "--speculative-draft-model-path", "an EAGLE-3 draft checkpoint directory",
            "Pass --speculative-draft-model-path DRAFT.", error=ServingError))
    if args.pp_size > 1:
        out.append(Finding(
            "pipeline-parallel", "--pp-size", args.pp_size, "1", "With pipeline parallelism "
            "only the last stage captures, so states of layers on earlier stages never reach "
            "the draft. Use --tp-size (and --ep-size) instead of --pp-size for EAGLE-3.",
            error=ServingError))
    if args.two_batch_overlap:
        out.append(Finding(
            "two-batch-overlap", "--enable-two-batch-overlap is", "set", "unset", "It runs "
            "decoder layers outside the loop that captures EAGLE-3 hidden states (the draft "
            "would get fewer states than its layout). Drop --enable-two-batch-overlap for "
            "EAGLE-3.", error=ServingError))
    return out + _tree_size(args)


def _tree_size(args: LaunchArgs) -> list[Finding]:
    """A top-k tree size SGLang 0.5.23 loads every weight for and then crashes on: more draft
    tokens than the tree proposes (``organize_draft_results`` takes the best n - 1 nodes
    unchecked), or fewer than steps + 1 (``_compact_accept_to_front``). SGLang resizes a
    chain (top-k 1) itself."""
    steps, k, n = args.num_steps, args.topk, args.num_draft_tokens
    if steps is None or k is None or n is None or k == 1:
        return []
    from eagle3_backend.verify.tree import max_draft_tokens

    most = max_draft_tokens(steps, k)
    flags = (f"--speculative-num-draft-tokens {n} with --speculative-num-steps {steps} "
             f"--speculative-eagle-topk {k};")
    if n > most:
        return [Finding(
            "tree-size", flags, f"a draft tree of {steps} step(s) with top-k {k} proposes at "
            f"most {most - 1} tokens", f"a verify step of at most {most} (the root + "
            f"{most - 1})", f"SGLang would load every weight and then stop at the first decode "
            f"('selected index k out of range'). Lower --speculative-num-draft-tokens to {most} "
            f"or less, or raise --speculative-num-steps or --speculative-eagle-topk.",
            error=ServingError)]
    if n < steps + 1:
        return [Finding(
            "tree-size", flags, f"SGLang's tree verify lays the accepted path (up to steps + 1 "
            f"= {steps + 1} tokens) into each request's {n} draft-token slots",
            f"at least {steps + 1} slots", f"SGLang would load every weight and then stop at "
            f"the first verify (a tensor size mismatch). Raise --speculative-num-draft-tokens "
            f"to {steps + 1} or more, or lower --speculative-num-steps to {n - 1}.",
            error=ServingError)]
    return []


def check_algorithm(algorithm: str | None, raw: Mapping[str, Any], ckpt: Any) -> list[Finding]:
    """SGLang's EAGLE path skips an EAGLE-3 draft's fc: nothing would be accepted."""
    archs, eagle = raw.get("architectures") or [], raw.get("eagle_config")
    if algorithm != "EAGLE" or not (
            any("eagle3" in str(a).lower() for a in archs) or "eagle3_layout" in raw
            or (isinstance(eagle, Mapping) and "eagle_aux_hidden_state_layer_ids" in eagle)):
        return []
    return [Finding(
        "algorithm", "--speculative-algorithm EAGLE was given", f"an EAGLE-3 draft ({ckpt}, "
        f"architectures {raw.get('architectures')})", "--speculative-algorithm EAGLE3",
        "SGLang's EAGLE path skips the draft's fc over the target's hidden states, so nothing "
        "is accepted (acceptance length 1.00, slower than no speculation).",
        error=ServingError)]


# ------------------------------------------------------------------- SGLang's loader
# SGLang 0.5.23 llama_eagle3.LlamaForCausalLMEagle3.load_weights, described:
# names containing a legacy key are rewritten (substring replace); names
# containing "d2t"/"t2d" are the vocabulary map; q/k/v and gate/up shards go
# into the fused params; any other name is loaded into ``name`` or
# ``model.<name>`` when the model has that parameter, and skipped otherwise.
_LEGACY = (("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"),
           ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2"))
_STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
            (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
            (".gate_up_proj", ".up_proj", 1))
_SHARDS = {".qkv_proj": ("q", "k", "v"), ".gate_up_proj": (0, 1)}


def sglang_num_aux(raw: Mapping[str, Any]) -> int:
    """K as SGLang 0.5.23 derives it from a draft config (fc and buffer widths use it)."""
    explicit = raw.get("num_aux_hidden_states")
    if explicit is not None:
        return int(explicit)
    eagle = raw.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, Mapping) else None
    return len(ids) if ids else 3


def sglang_draft_params(raw: Mapping[str, Any], num_aux: int) -> set[str]:
    """Parameter names of SGLang 0.5.23's LlamaForCausalLMEagle3 built from ``raw``."""
    eagle = raw.get("eagle_config") or {}
    params = {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight"}
    if raw.get("bias"):
        params.add("model.fc.bias")
    if (eagle.get("norm_before_fc") if isinstance(eagle, Mapping) else None) or raw.get("norm_before_fc"):
        params.add("model.input_norm.weight")
    if raw.get("fc_norm") or raw.get("use_aux_norm"):
        params |= {f"model.fc_norm.{i}.weight" for i in range(num_aux)}
    attention_bias = bool(raw.get("attention_bias") or raw.get("bias"))
    for i in range(int(raw.get("num_hidden_layers", 1))):
        p = f"model.layers.{i}."
        params |= {p + n for n in ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
                                    "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
                                    "input_layernorm.weight", "post_attention_layernorm.weight",
                                    "hidden_norm.weight")}
        if attention_bias:
            params.add(p + "self_attn.o_proj.bias")
    if not raw.get("tie_word_embeddings"):
        params.add("lm_head.weight")
    return params


def sglang_unread_params(num_hidden_layers: int) -> set[str]:
    """Parameters SGLang 0.5.23's LlamaForCausalLMEagle3 creates but its forward never reads:
    the ``input_layernorm`` of layers 1+ (they normalise their input with ``hidden_norm``),
    so no checkpoint needs to load them."""
    return {f"model.layers.{i}.input_layernorm.weight" for i in range(1, num_hidden_layers)}


def sglang_load_target(name: str, params: set[str]) -> tuple[str | None, Any]:
    """(parameter, shard) SGLang's EAGLE-3 loader puts tensor ``name`` into; (None, None) = skipped.

    The vocabulary map ("d2t"/"t2d" in the name) is ("<vocab map>", None).
    """
    for legacy, new in _LEGACY:
        if legacy in name:
            name = name.replace(legacy, new)
    if "d2t" in name or "t2d" in name:
        return "<vocab map>", None
    for param, shard_name, shard in _STACKED:
        if shard_name not in name:
            continue
        name = name.replace(shard_name, param)
        full = name if name in params else f"model.{name}"
        return (full, shard) if full in params else (None, None)
    full = name if name in params else f"model.{name}"
    return (full, None) if full in params else (None, None)


def sglang_unconsumed(raw: Mapping[str, Any], names: Iterable[str], num_aux: int,
                      where: str = "draft") -> list[Finding]:
    """Why SGLang's loader would not consume this checkpoint cleanly (empty: it would)."""
    params = sglang_draft_params(raw, num_aux)
    skipped, filled = [], {}
    for name in names:
        param, shard = sglang_load_target(name, params)
        if param is None:
            skipped.append(name)
        else:
            filled.setdefault(param, set()).add(shard)
    out = []
    if skipped:
        out.append(Finding(
            "sglang-skips", f"{where}: SGLang's EAGLE-3 loader would skip tensor(s)",
            sorted(skipped), "every tensor to load a parameter of LlamaForCausalLMEagle3",
            "It skips them without a word, serving those weights at their random initial "
            "values. Rename them to SGLang's names (fc, midlayer.*, norm, lm_head, d2t, t2d) "
            "with `eagle3 convert --to sglang`, or fix the config flags that create the "
            "parameters."))
    # the worker installs the target's embedding; some parameters are never read
    borrowed = {"model.embed_tokens.weight"} | sglang_unread_params(
        int(raw.get("num_hidden_layers", 1)))
    if not raw.get("tie_word_embeddings") and raw.get("draft_vocab_size") is None:
        borrowed.add("lm_head.weight")  # load_lm_head_from_target
    unfilled = []
    for param in sorted(params - borrowed):
        got = filled.get(param)
        need = next((s for suffix, s in _SHARDS.items() if param.endswith(suffix + ".weight")), (None,))
        if got is None or not set(need) <= got:
            missing = "" if got is None else f" (shards {sorted(map(str, set(need) - got))})"
            unfilled.append(param + missing)
    if unfilled:
        out.append(Finding(
            "sglang-random", f"{where}: SGLang's EAGLE-3 model would keep parameter(s)",
            f"{unfilled} at their random initial values", "a tensor in the checkpoint for "
            "each", "Add the missing tensors, or fix the config flags (bias, attention_bias, "
            "fc_norm, norm_before_fc, num_hidden_layers, tie_word_embeddings) that create "
            "these parameters."))
    return out
