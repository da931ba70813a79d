"""Refusals before any weight is loaded: is this target/draft pair servable, and how.

:func:`check_launch` runs in the launcher process (``runtime.after_check_server_args``),
after SGLang resolved its arguments and before it starts a scheduler, i.e.
before the target's weights (a terabyte for Kimi-K2) are read. It returns the
:class:`~eagle3_backend.serving.capture.ServingPlan` the schedulers follow, or
raises one error listing every problem found:

* ``--speculative-algorithm EAGLE`` (or NEXTN) given an EAGLE-3 draft: SGLang
  would skip the fc layer and accept nothing (acceptance 1.00);
* fc width != len(layout) x target hidden size, and the widths SGLang derives
  from the draft config (it builds fc and its buffers from those);
* layout sources outside the target, or not capturable by its model file;
* draft vocabulary != target vocabulary, d2t mapping outside the target vocabulary;
* a draft tensor SGLang's EAGLE-3 loader would skip without a word, or a
  parameter it would leave at its random initial value;
* a draft with no recorded layout: served with the engine default, stated
  loudly, unless ``EAGLE3_LAYOUT`` names the layout.

Nothing here imports SGLang: the launcher hook reads SGLang's arguments into
:class:`LaunchArgs` and the target into a :class:`~eagle3_backend.target.TargetInfo`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from eagle3_backend.errors import (
    CheckpointError,
    Eagle3Error,
    LayoutError,
    LayoutMismatch,
    ServingError,
)
from eagle3_backend.layout import Layout
from eagle3_backend.serving.capture import ServingPlan, arch_capture
from eagle3_backend.target import TargetInfo

logger = logging.getLogger(__name__)

#: Set by the user: the draft's layout, when its checkpoint records none.
LAYOUT_ENV = "EAGLE3_LAYOUT"
#: Set by the launcher for its schedulers (internal): the checked ServingPlan as JSON.
PLAN_ENV = "EAGLE3_SERVING_PLAN"

EAGLE3_DRAFT_ARCHS = ("LlamaForCausalLMEagle3",)

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


@dataclass(frozen=True, slots=True)
class LaunchArgs:
    """The SGLang arguments the checks read (after SGLang's own resolution)."""

    algorithm: str | None  # resolved: NEXTN is already EAGLE
    draft_path: str | None
    pp_size: int = 1
    two_batch_overlap: bool = False
    num_steps: int | None = None  # --speculative-num-steps (None: not resolved, not checked)
    topk: int | None = None  # --speculative-eagle-topk
    num_draft_tokens: int | None = None  # --speculative-num-draft-tokens

    def __post_init__(self) -> None:
        if self.algorithm is not None:
            object.__setattr__(self, "algorithm", str(self.algorithm).upper())


@dataclass(frozen=True, slots=True)
class _Problem:
    kind: type[Eagle3Error]
    message: str


class _Problems:
    def __init__(self) -> None:
        self.items: list[_Problem] = []

    def add(self, kind: type[Eagle3Error], message: str) -> None:
        self.items.append(_Problem(kind, message))

    def raise_if_any(self, what: str) -> None:
        if not self.items:
            return
        first = self.items[0]
        if len(self.items) == 1:
            raise first.kind(f"eagle3_backend refuses to start: {first.message}")
        lines = "\n".join(f"  - {p.kind.__name__}: {p.message}" for p in self.items)
        raise first.kind(f"eagle3_backend refuses to start ({len(self.items)} problems with {what}):\n{lines}")


# ------------------------------------------------------------------------ entry point
def check_launch(args: LaunchArgs, target: TargetInfo | None,
                 env: Mapping[str, str] | None = None) -> ServingPlan | None:
    """The plan for an EAGLE-3 launch, None when this plugin has nothing to serve; raises on refusal.

    ``target`` is needed for EAGLE3 only (the EAGLE check reads the draft alone).
    """
    env = os.environ if env is None else env
    if args.algorithm == "EAGLE":
        _refuse_eagle_with_eagle3_draft(args.draft_path)
        return None
    if args.algorithm != "EAGLE3":
        return None
    if not args.draft_path:
        raise ServingError(
            "eagle3_backend refuses to start: --speculative-algorithm EAGLE3 without "
            "--speculative-draft-model-path; expected an EAGLE-3 draft checkpoint directory. "
            "Pass --speculative-draft-model-path DRAFT."
        )
    if target is None:
        raise ServingError("check_launch: an EAGLE3 launch needs the target's TargetInfo")
    arch_capture(target.architecture)  # unsupported target: clear ServingError
    parallel = _Problems()
    if args.pp_size > 1:
        parallel.add(ServingError, (
            f"--pp-size {args.pp_size}: with pipeline parallelism only the last stage captures, "
            f"so states of layers on earlier stages never reach the draft. Use --tp-size (and "
            f"--ep-size) instead of --pp-size for EAGLE-3."))
    if args.two_batch_overlap:
        parallel.add(ServingError, (
            "--enable-two-batch-overlap runs decoder layers outside the loop that captures "
            "EAGLE-3 hidden states (the draft would get fewer states than its layout). Drop "
            "--enable-two-batch-overlap for EAGLE-3."))
    parallel.raise_if_any("the parallel setup")
    _check_tree_size(args)

    ckpt = _local_dir(args.draft_path)
    from eagle3_backend.checkpoint import load_draft, read_config

    raw = read_config(ckpt)
    archs = raw.get("architectures") or []
    if not any(a in EAGLE3_DRAFT_ARCHS for a in archs):
        raise CheckpointError(
            f"eagle3_backend refuses to start: draft {ckpt} declares architectures {archs}; "
            f"expected {list(EAGLE3_DRAFT_ARCHS)}, the SGLang EAGLE-3 draft this plugin checks "
            f"and serves. Convert a speculators/EAGLE-repo draft with `eagle3 convert {ckpt} OUT "
            f"--to sglang --target <target>` and serve OUT; serve other draft architectures with "
            f"stock SGLang (SGLANG_PLUGINS without 'eagle3')."
        )
    loaded = load_draft(ckpt, target=target, strict=False)
    layout, source = resolve_layout(loaded, env)
    problems = _Problems()
    _check_widths(problems, loaded, raw, layout, target)
    _check_range(problems, layout, target)
    _check_vocab(problems, loaded, target)
    consumption = sglang_unconsumed(raw, _raw_tensor_names(ckpt), len(layout))
    for message in consumption:
        problems.add(CheckpointError, f"draft {ckpt}: {message}")
    if not consumption:
        from eagle3_backend.checkpoint.checks import check_tensors

        for message in check_tensors(loaded.config, loaded.state_dict, str(ckpt)):
            problems.add(CheckpointError, message)
    problems.raise_if_any(f"draft {ckpt} on target {target.source}")
    return ServingPlan(layout=layout, architecture=target.architecture,
                       num_layers=target.num_hidden_layers, hidden_size=target.hidden_size,
                       draft_path=str(args.draft_path), layout_source=source)


def _check_tree_size(args: LaunchArgs) -> None:
    """Refuse a top-k tree size SGLang 0.5.23 loads every weight for and then crashes on.

    * more draft tokens than the tree proposes: it takes the best ``num_draft_tokens - 1``
      of the nodes its draft scores (``organize_draft_results``) without checking there
      are that many ('selected index k out of range' at the first decode);
    * fewer than ``steps + 1``: its tree verify moves the accepted path (up to steps + 1
      tokens) to the front of each request's block of ``num_draft_tokens`` slots
      (``_compact_accept_to_front``), a tensor size mismatch at the first verify.

    A chain (top-k 1) is resized to ``steps + 1`` by SGLang itself.
    """
    steps, k, n = args.num_steps, args.topk, args.num_draft_tokens
    if steps is None or k is None or n is None or k == 1:
        return
    from eagle3_backend.verify.tree import max_draft_tokens

    most = max_draft_tokens(steps, k)
    if n > most:
        raise ServingError(
            f"eagle3_backend refuses to start: --speculative-num-draft-tokens {n} with "
            f"--speculative-num-steps {steps} --speculative-eagle-topk {k}; a draft tree of "
            f"{steps} step(s) with top-k {k} proposes at most {most - 1} tokens, so a verify step "
            f"holds at most {most} (the root + {most - 1}). SGLang would load every weight and "
            f"then stop at the first decode ('selected index k out of range'). Lower "
            f"--speculative-num-draft-tokens to {most} or less, or raise --speculative-num-steps "
            f"or --speculative-eagle-topk.")
    if n < steps + 1:
        raise ServingError(
            f"eagle3_backend refuses to start: --speculative-num-draft-tokens {n} with "
            f"--speculative-num-steps {steps} --speculative-eagle-topk {k}; SGLang's tree verify "
            f"lays the accepted path (up to steps + 1 = {steps + 1} tokens) into each request's "
            f"{n} draft-token slots, so it needs at least {steps + 1}. SGLang would load every "
            f"weight and then stop at the first verify (a tensor size mismatch). Raise "
            f"--speculative-num-draft-tokens to {steps + 1} or more, or lower "
            f"--speculative-num-steps to {n - 1}.")


# ------------------------------------------------------------------------- algorithm
def is_eagle3_draft(raw: Mapping[str, Any]) -> bool:
    archs = raw.get("architectures") or []
    eagle = raw.get("eagle_config")
    return (any("eagle3" in str(a).lower() for a in archs) or "eagle3_layout" in raw
            or (isinstance(eagle, Mapping) and "eagle_aux_hidden_state_layer_ids" in eagle))


def _refuse_eagle_with_eagle3_draft(draft_path: str | None) -> None:
    if not draft_path or not (Path(draft_path) / "config.json").is_file():
        return
    try:
        raw = json.loads((Path(draft_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # SGLang reports an unreadable draft config itself
    if isinstance(raw, dict) and is_eagle3_draft(raw):
        raise ServingError(
            f"eagle3_backend refuses to start: --speculative-algorithm EAGLE was given an EAGLE-3 "
            f"draft ({draft_path}, architectures {raw.get('architectures')}); SGLang's EAGLE path "
            f"skips the draft's fc over the target's hidden states, so nothing is accepted "
            f"(acceptance length 1.00, slower than no speculation). Use --speculative-algorithm EAGLE3."
        )


# ---------------------------------------------------------------------------- layout
def resolve_layout(loaded: Any, env: Mapping[str, str]) -> tuple[Layout, str]:
    """The layout to serve and where it came from; a missing layout is said loudly."""
    given = env.get(LAYOUT_ENV, "").strip()
    recorded, source = loaded.layout, loaded.layout_source
    if given:
        try:
            layout = Layout.parse(given)
        except LayoutError as exc:
            raise LayoutError(f"eagle3_backend refuses to start: {LAYOUT_ENV}={given!r}: {exc}") from None
        if source == "explicit" and layout != recorded:
            raise LayoutMismatch(
                f"eagle3_backend refuses to start: {LAYOUT_ENV}={given!r} is {layout} but draft "
                f"{loaded.path} records eagle3_layout {recorded}; expected them equal. Unset "
                f"{LAYOUT_ENV} (the recorded layout is what the draft was trained on)."
            )
        if source == "engine-ids" and layout != recorded:
            logger.warning("eagle3_backend: %s=%s overrides the layout read from the draft's ids "
                           "(%s)", LAYOUT_ENV, layout, loaded.layout_explanation)
        else:
            logger.info("eagle3_backend: layout %s from %s", layout, LAYOUT_ENV)
        return layout, "env" if source != "explicit" else source
    if source == "assumed-default":
        logger.warning(
            "eagle3_backend: DRAFT %s RECORDS NO LAYOUT; serving the engine default %s (%s). "
            "If the draft was trained on other hidden states, acceptance collapses. Set %s='[...]' "
            "to the training layout, or record it with `eagle3 convert`.",
            loaded.path, recorded, loaded.layout_explanation, LAYOUT_ENV)
    else:
        logger.info("eagle3_backend: layout %s (%s)", recorded, loaded.layout_explanation)
    return recorded, source


# ---------------------------------------------------------------------------- widths
def sglang_num_aux(raw: Mapping[str, Any]) -> int:
    """K as SGLang 0.5.23 derives it from a draft config (fc and buffer widths use it)."""
    explicit = raw.get("num_aux_hidden_states")
    if explicit is not None:
        return int(explicit)
    eagle = raw.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, Mapping) else None
    return len(ids) if ids else 3


def _check_widths(problems: _Problems, loaded: Any, raw: Mapping[str, Any], layout: Layout,
                  target: TargetInfo) -> None:
    K, Ht = len(layout), target.hidden_size
    want = K * Ht
    fc = loaded.state_dict.get("fc.weight")
    if fc is not None and fc.dim() == 2 and int(fc.shape[1]) != want:
        problems.add(LayoutMismatch, (
            f"draft fc expects {int(fc.shape[1])} inputs; layout {layout} gives {K} x {Ht} = "
            f"{want} (target {target.architecture} hidden size {Ht}). Re-export the draft with "
            f"its training layout, or serve it on the target it was trained for."))
    eagle = raw.get("eagle_config") or {}
    if isinstance(eagle, Mapping) and eagle.get("use_aux_hidden_state", True) is False:
        problems.add(LayoutMismatch, (
            "draft config sets eagle_config.use_aux_hidden_state false, so SGLang would feed it "
            "no target states at all; expected true for an EAGLE-3 draft. Remove the flag."))
    sglang_k = sglang_num_aux(raw)
    if sglang_k != K:
        problems.add(LayoutMismatch, (
            f"SGLang derives {sglang_k} fc input slots from the draft config (num_aux_hidden_states "
            f"or len(eagle_config.eagle_aux_hidden_state_layer_ids), default 3) but layout "
            f"{layout} has {K}; it would build fc {sglang_k} x {Ht} wide. Rewrite the config with "
            f"`eagle3 convert`, or set \"num_aux_hidden_states\": {K}."))
    th = raw.get("target_hidden_size", raw.get("hidden_size"))
    if th != Ht:
        problems.add(LayoutMismatch, (
            f"draft config target_hidden_size is {th} but the target's hidden size is {Ht}; SGLang "
            f"builds the draft's fc from the config, so it would not match the target. The draft "
            f"was trained for another target."))


def _check_range(problems: _Problems, layout: Layout, target: TargetInfo) -> None:
    try:
        ServingPlan(layout=layout, architecture=target.architecture,
                    num_layers=target.num_hidden_layers, hidden_size=target.hidden_size,
                    draft_path="-", layout_source="-")
    except LayoutError as exc:
        problems.add(LayoutError, str(exc))


def _check_vocab(problems: _Problems, loaded: Any, target: TargetInfo) -> None:
    from eagle3_backend.checkpoint.checks import check_vocab_map

    cfg = loaded.config
    if cfg.vocab_size != target.vocab_size:
        problems.add(CheckpointError, (
            f"draft vocab_size (the target vocabulary it predicts into) is {cfg.vocab_size} but "
            f"target {target.architecture} has {target.vocab_size}; expected equal. The draft "
            f"belongs to another tokenizer."))
    d2t = loaded.state_dict.get("d2t")
    if d2t is not None:
        for message in check_vocab_map(cfg, d2t, None, loaded.path, target.vocab_size,
                                       vocab_what=f"target vocab_size {target.vocab_size}"):
            problems.add(CheckpointError, message)


# ------------------------------------------------------------------- SGLang's loader
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


def sglang_unconsumed(raw: Mapping[str, Any], names: Iterable[str], num_aux: int) -> list[str]:
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
        out.append(
            f"SGLang's EAGLE-3 loader would skip tensor(s) {sorted(skipped)} without a word (no "
            f"parameter of LlamaForCausalLMEagle3 takes them), serving those weights at their "
            f"random initial values. Rename them to SGLang's names (fc, midlayer.*, norm, lm_head, "
            f"d2t, t2d) with `eagle3 convert --to sglang`, or fix the config flags that create "
            f"the parameters.")
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
        out.append(
            f"SGLang's EAGLE-3 model would keep parameter(s) {unfilled} at their random initial "
            f"values: no tensor in the checkpoint loads them. Add the missing tensors, or fix the "
            f"config flags (bias, attention_bias, fc_norm, norm_before_fc, num_hidden_layers, "
            f"tie_word_embeddings) that create these parameters.")
    return out


def _raw_tensor_names(ckpt: Path) -> list[str]:
    """Tensor names exactly as stored (what SGLang's loader iterates), from the file headers."""
    from safetensors import safe_open

    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        paths = [ckpt / f for f in files]
    else:
        paths = sorted(ckpt.glob("*.safetensors"))
    names: list[str] = []
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            names.extend(f.keys())
    return names


def _local_dir(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        return p
    try:  # a hub id: SGLang would download it too; do it now, before the target loads
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:
        raise CheckpointError(
            f"eagle3_backend refuses to start: draft {path!r} is not a local directory and could "
            f"not be fetched ({type(exc).__name__}: {exc}); expected an EAGLE-3 checkpoint directory. "
            f"Download it first and pass the directory."
        ) from None
