"""The hook handlers named in ``hooks.HOOKS``; each one is a thin adapter.

launcher   after_check_server_args        pre-load checks -> ServingPlan in $EAGLE3_SERVING_PLAN
scheduler  around_configure_capture       target captures exactly the plan's layers
           (collect.LayoutAuxList/Packer) captures land in their layout slots
           before_logits_forward          packed [T, K*H] handed on; warm-up self-check
           around_draft_load_weights      no draft tensor skipped, no parameter left random
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

from eagle3_backend.errors import CheckpointError, Eagle3Error, ServingError
from eagle3_backend.checkpoint import suite
from eagle3_backend.serving import checks, collect, drafts, hooks
from eagle3_backend.serving.checks import launch_args, process_plan, target_of
from eagle3_backend.plan import ServingPlan, arch_capture

logger = logging.getLogger(__name__)

#: The launcher's exit status when the pre-load checks refuse the launch.
EXIT_REFUSED = 2
_LOGITS_FORWARD = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"


# ----------------------------------------------------------------------------- launcher
def before_resolve_speculative_algorithm(*args: Any, **kwargs: Any) -> None:
    """BEFORE SGLang reads an EAGLE-3 draft's config while resolving the arguments: a draft path
    that is neither a directory nor a checkpoint that can be fetched gets the refusal."""
    algorithm = args[0] if args else kwargs.get("speculative_algorithm")
    path = args[1] if len(args) > 1 else kwargs.get("speculative_draft_model_path")
    if str(algorithm or "").upper() != "EAGLE3" or not path:
        return None
    try:
        checks.local_dir(path)
    except Eagle3Error as exc:
        logger.error("%s", exc)
        raise SystemExit(EXIT_REFUSED) from None
    return None


def after_check_server_args(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ServerArgs.check_server_args: refuse before loading weights, or hand the plan on."""
    launch = launch_args(server_args)
    os.environ.pop(checks.PLAN_ENV, None)  # never let a stale plan reach the schedulers
    os.environ.pop(drafts.DRAFT_ENV, None)
    if launch.algorithm not in ("EAGLE", "EAGLE3"):
        return None
    try:
        target = None
        if launch.algorithm == "EAGLE3":
            target = target_of(server_args)
            problems = hooks.verify("serve") + hooks.verify_arch(target.architecture)
            if problems:
                raise ServingError(hooks.fail_closed_line(problems[0]))
        plan = checks.check_launch(launch, target)
    except Eagle3Error as exc:
        # the refusal is the launch's last words: its one paragraph, no traceback
        logger.error("%s", exc)
        raise SystemExit(EXIT_REFUSED) from None
    if plan is None:
        return None
    os.environ[checks.PLAN_ENV] = plan.to_json()
    logger.info("eagle3_backend: pre-load checks passed: draft %s on %s (%d layers, hidden %d); "
                "layout %s (%s) -> fc input %d", plan.draft_path, plan.architecture,
                plan.num_layers, plan.hidden_size, plan.layout, plan.layout_source,
                plan.fc_in_features)
    drafts.decide_in_launcher()  # the live-draft admin: on, or off with one line
    return None


# ---------------------------------------------------------------------------- scheduler
def _require_plan() -> ServingPlan:
    spec = hooks.use("sglang.srt.runtime_context.get_spec")()
    plan = process_plan()
    if plan is None:
        raise ServingError(
            "eagle3_backend: this EAGLE-3 scheduler has no checked serving plan (the launcher's "
            "pre-load checks did not run in its parent process). Start the server with "
            "python -m sglang.launch_server or sglang.Engine."
        )
    if str(spec.speculative_draft_model_path) != plan.draft_path:
        raise ServingError(
            f"eagle3_backend: the scheduler serves draft {spec.speculative_draft_model_path} but "
            f"the launcher checked {plan.draft_path}; expected the same. Restart the server."
        )
    return plan


def around_configure_capture(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND configure_aux_hidden_state_capture: the target captures exactly the layout."""
    spec = hooks.use("sglang.srt.runtime_context.get_spec")()
    algorithm = str(spec.speculative_algorithm or "").upper()
    if not kwargs.get("eagle_use_aux_hidden_state") or algorithm != "EAGLE3":
        return original(*args, **kwargs)
    plan = _require_plan()
    model = kwargs["model"]
    arch = arch_capture(plan.architecture)
    module, _, cls_name = arch.model_class.rpartition(".")
    if not any(c.__name__ == cls_name and c.__module__ == module for c in type(model).__mro__):
        raise ServingError(
            f"eagle3_backend: the target model is {type(model).__module__}.{type(model).__name__}, "
            f"not the {arch.model_class} whose capture rule the plan was checked for "
            f"({plan.architecture}); refusing to guess its capture. Restart the server."
        )
    ids = plan.model_ids()
    kwargs["eagle_aux_hidden_state_layer_ids"] = ids
    result = original(*args, **kwargs)
    inner = model
    for name in arch.inner.split("."):
        inner = getattr(inner, name, None)
    got = getattr(inner, "layers_to_capture", None)
    if got is None or sorted(int(i) for i in got) != list(plan.capture_layers):
        raise ServingError(
            f"eagle3_backend: SGLang {hooks.sglang_version()}'s {type(model).__name__} turned ids "
            f"{ids} into layers_to_capture {got}; expected {list(plan.capture_layers)} for layout "
            f"{plan.layout}. Its id rule differs from SGLang {hooks.SUPPORTED_SGLANG}'s; refusing to "
            f"serve a draft on the wrong hidden states."
        )
    collect.activate(plan, embed=getattr(inner, "embed_tokens", None))
    logger.info("eagle3_backend: %s captures %s: layer inputs %s (SGLang ids %s), packed in "
                "layout order into fc input %d", plan.architecture, plan.layout,
                list(plan.capture_layers), ids, plan.fc_in_features)
    return result


@functools.cache
def _aux_position() -> int:
    return hooks.param_index(_LOGITS_FORWARD, "aux_hidden_states")


def before_logits_forward(*args: Any, **kwargs: Any) -> tuple[tuple, dict] | None:
    """BEFORE LogitsProcessor.forward: hand on the packed fc input; self-check once."""
    st = collect.state()
    if st.plan is None:
        return None
    pos = _aux_position()
    in_kwargs = "aux_hidden_states" in kwargs
    aux = kwargs["aux_hidden_states"] if in_kwargs else (args[pos] if len(args) > pos else None)
    if aux is None:
        return None
    if isinstance(aux, collect.aux_list_class()) and aux.eagle3_active:
        packed = aux.pack()  # [T, K*H]
        if in_kwargs:
            kwargs["aux_hidden_states"] = packed
        else:
            args = (*args[:pos], packed, *args[pos + 1:])
    if st.selfcheck_pending and st.last_packed is not None:
        current = kwargs["aux_hidden_states"] if in_kwargs else args[pos]
        if current is st.last_packed:
            _maybe_self_check(st, input_ids=args[1] if len(args) > 1 else kwargs.get("input_ids"),
                              meta=args[4] if len(args) > 4 else kwargs.get("logits_metadata"))
    return args, kwargs


def _maybe_self_check(st: collect.CaptureState, input_ids: Any, meta: Any) -> None:
    import torch

    from eagle3_backend.serving.selfcheck import EmbeddingShard, self_check

    packed = st.last_packed
    mode = getattr(meta, "forward_mode", None)
    if (mode is None or not mode.is_extend() or packed.shape[0] == 0
            or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())):
        return  # not a real prefill: wait for the first one
    st.last_packed = None
    if input_ids is None and meta is not None:
        # a multimodal wrapper (Kimi-K2.5) runs its language model on input embeddings, so the
        # logits processor gets no ids; the batch has them, and they are the embedded tokens
        # unless the batch carries images, audio or video
        contains_mm = getattr(meta, "contains_mm_inputs", None)
        if contains_mm is not None and contains_mm():
            _warn_once("eagle3_backend: EAGLE-3 self-check waits for a prefill without images, "
                       "audio or video (their rows are not token embeddings)")
            return
        input_ids = getattr(meta, "input_ids", None)
    if input_ids is None or input_ids.shape[0] != packed.shape[0]:
        # e.g. data-parallel attention scatters rows; a later prefill may line up
        _warn_once("eagle3_backend: EAGLE-3 self-check waits for a prefill whose input ids line "
                   "up with the captured rows (got %s ids for %d rows)",
                   None if input_ids is None else input_ids.shape[0], packed.shape[0])
        return
    line = self_check(packed, input_ids, st.plan.layout, EmbeddingShard.of(st.embed))
    st.selfcheck_pending = False
    logger.info("%s", line)
    dump = os.environ.get(DUMP_ENV)
    if dump:
        _dump_fc_input(dump.format(pid=os.getpid()), packed, input_ids, st.plan)


_WARNED: set[str] = set()


def _warn_once(msg: str, *args: Any) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        logger.warning(msg, *args)


#: A path (``{pid}`` is replaced) to write the self-checked fc input to, as safetensors.
DUMP_ENV = "EAGLE3_DUMP_FC_INPUT"


def _dump_fc_input(path: str, packed: Any, input_ids: Any, plan: ServingPlan) -> None:
    """What the target captured on the checked forward: ids [T], fc_input [T, K*H] (layout order)."""
    from safetensors.torch import save_file

    save_file({"input_ids": input_ids.detach().cpu().contiguous(),
               "fc_input": packed.detach().cpu().contiguous()}, path,
              metadata={"layout": str(plan.layout), "architecture": plan.architecture})
    logger.info("eagle3_backend: wrote the checked fc input to %s", path)


# ------------------------------------------------------------------------------- draft
def around_draft_load_weights(original: Callable[..., Any], model: Any, weights: Any) -> Any:
    """AROUND LlamaForCausalLMEagle3.load_weights: every tensor consumed, every param loaded."""
    if process_plan() is None:
        return original(model, weights)
    default_loader = hooks.use("sglang.srt.model_loader.weight_utils.default_weight_loader")
    params = dict(model.named_parameters())
    current: list[str | None] = [None]
    consumed: set[str] = set()
    loaded: set[str] = set()
    seen: dict[str, tuple[int, ...]] = {}  # name -> shape, in the order SGLang read them
    saved: dict[str, Any] = {}
    unwrapped: list[str] = []

    for pname, param in params.items():
        inner = getattr(param, "weight_loader", default_loader)

        def tracked(p: Any, w: Any, *a: Any, _inner: Any = inner, _name: str = pname, **k: Any) -> Any:
            consumed.add(current[0])
            loaded.add(_name)
            return _inner(p, w, *a, **k)

        old = param.__dict__.get("weight_loader", _MISSING)
        try:
            param.weight_loader = tracked
        except AttributeError:  # a parameter class whose loader is a read-only property
            unwrapped.append(pname)
        else:
            saved[pname] = old

    def tap(it: Any) -> Any:
        for name, tensor in it:
            current[0] = name
            seen[name] = tuple(tensor.shape)
            yield name, tensor

    try:
        result = original(model, tap(weights))
    finally:
        for pname, old in saved.items():
            if old is _MISSING:
                params[pname].__dict__.pop("weight_loader", None)
            else:
                params[pname].weight_loader = old
    if unwrapped:
        logger.warning("eagle3_backend: cannot track loads of draft params %s; their consumption "
                       "was checked before start-up only", unwrapped)
        drafts.after_draft_load(seen)
        return result
    skipped = [n for n in seen if n not in consumed and "d2t" not in n and "t2d" not in n]
    layers = int(getattr(getattr(model, "config", None), "num_hidden_layers", 1) or 1)
    borrowed = {"model.embed_tokens.weight"} | suite.sglang_unread_params(layers)
    if getattr(model, "load_lm_head_from_target", False):
        borrowed.add("lm_head.weight")
    never = sorted(set(params) - loaded - borrowed)
    if skipped or never:
        raise CheckpointError(
            f"eagle3_backend: SGLang's EAGLE-3 loader skipped draft tensor(s) {sorted(skipped)} and "
            f"left parameter(s) {never} unloaded; the draft would serve random weights. Rename the "
            f"tensors to SGLang's names with `eagle3 convert --to sglang`."
        )
    logger.info("eagle3_backend: draft weights: %d tensors, every one consumed by SGLang's loader",
                len(seen))
    drafts.after_draft_load(seen)
    return result


_MISSING = object()
