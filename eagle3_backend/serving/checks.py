"""Refusals before any weight is loaded: the check suite, asked by the launcher.

:func:`check_launch` runs in the launcher (``runtime.after_check_server_args``) after
SGLang resolved its arguments, before the target's weights (a terabyte for Kimi-K2) are
read. It asks :mod:`eagle3_backend.checkpoint.suite` (the words ``eagle3 validate``
prints) and returns the :class:`~eagle3_backend.plan.ServingPlan` the
schedulers follow, or raises one error stating every problem. It adds the serving side:
``EAGLE3_LAYOUT`` for a draft that records no layout (else the engine default, said
loudly), and fetching a hub-id draft. Nothing here imports SGLang.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from eagle3_backend.checkpoint import suite
from eagle3_backend.checkpoint.suite import LaunchArgs
from eagle3_backend.errors import CheckpointError, LayoutError, LayoutMismatch, ServingError
from eagle3_backend.layout import Layout
from eagle3_backend.plan import ServingPlan
from eagle3_backend.serving import hooks
from eagle3_backend.target import TargetInfo

logger = logging.getLogger(__name__)

__all__ = ["LAYOUT_ENV", "PLAN_ENV", "REFUSES", "LaunchArgs", "check_launch", "resolve_layout"]

#: Set by the user: the draft's layout, when its checkpoint records none.
LAYOUT_ENV = "EAGLE3_LAYOUT"
#: Set by the launcher for its schedulers (internal): the checked ServingPlan as JSON.
PLAN_ENV = "EAGLE3_SERVING_PLAN"
REFUSES = "eagle3_backend refuses to start"


# ------------------------------------------------------------------------ entry point
def check_launch(args: LaunchArgs, target: TargetInfo | None,
                 env: Mapping[str, str] | None = None) -> ServingPlan | None:
    """The plan for an EAGLE-3 launch, None when this plugin has nothing to serve; raises on refusal.

    ``target`` is needed for EAGLE3 only (the EAGLE check reads the draft alone).
    """
    env = os.environ if env is None else env
    if args.algorithm not in ("EAGLE", "EAGLE3"):
        return None
    if args.algorithm == "EAGLE3" and target is None:
        raise ServingError("check_launch: an EAGLE3 launch needs the target's TargetInfo")
    if not args.draft_path or (args.algorithm == "EAGLE" and not Path(args.draft_path).is_dir()):
        _raise(suite.check_args(args), "the launch")
        return None  # EAGLE from a hub id: SGLang reports what it cannot read itself
    ckpt = local_dir(args.draft_path)
    try:
        verdict = suite.judge(ckpt, target, args=args,
                              choose_layout=lambda loaded: resolve_layout(loaded, env))
    except CheckpointError as exc:
        if args.algorithm == "EAGLE":
            return None  # SGLang reports an unreadable draft config itself
        raise CheckpointError(f"{REFUSES}: {exc}") from None
    _raise(verdict.findings, f"draft {ckpt} on target {target.source if target else '-'}")
    if args.algorithm == "EAGLE":
        return None
    return ServingPlan(layout=verdict.layout, architecture=target.architecture,
                       num_layers=target.num_hidden_layers, hidden_size=target.hidden_size,
                       draft_path=str(args.draft_path), layout_source=verdict.layout_source)


def _raise(findings: Any, what: str) -> None:
    error = suite.refusal(findings, REFUSES, what)
    if error is not None:
        raise error


# ---------------------------------------------------------------------------- layout
def resolve_layout(loaded: Any, env: Mapping[str, str]) -> tuple[Layout, str]:
    """The layout to serve and where it came from; a missing layout is said loudly."""
    given = env.get(LAYOUT_ENV, "").strip()
    recorded, source = loaded.layout, loaded.layout_source
    if given:
        try:
            layout = Layout.parse(given)
        except LayoutError as exc:
            raise LayoutError(f"{REFUSES}: {LAYOUT_ENV}={given!r}: {exc}") from None
        if source == "explicit" and layout != recorded:
            raise LayoutMismatch(
                f"{REFUSES}: {LAYOUT_ENV}={given!r} is {layout} but draft "
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


@functools.lru_cache(maxsize=8)
def local_dir(path: str) -> Path:
    """The draft's directory: ``path``, or a hub id fetched (its configs and safetensors), once
    a process: the launcher asks before SGLang reads the draft's config and again in its checks."""
    p = Path(path)
    if p.is_dir():
        return p
    if p.exists() or path.startswith(("/", ".", "~")):
        raise CheckpointError(
            f"{REFUSES}: draft {path!r} {'is not a directory' if p.exists() else 'does not exist'}; "
            "expected an EAGLE-3 checkpoint directory. Check --speculative-draft-model-path.")
    try:  # a hub id: SGLang would download it too; do it now, before the target loads
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:
        raise CheckpointError(
            f"{REFUSES}: draft {path!r} is not a local directory and could "
            f"not be fetched ({type(exc).__name__}: {exc}); expected an EAGLE-3 checkpoint directory. "
            f"Download it first and pass the directory."
        ) from None


# ------------------------------------------------- what a process of this launch reads
def launch_args(server_args: Any) -> LaunchArgs:
    """The launch arguments the checks read, from SGLang's resolved view of ``server_args``."""
    cfg = hooks.use("sglang.srt.arg_groups.model_override_base.resolving_view")(server_args)
    return LaunchArgs(
        algorithm=cfg.speculative_algorithm,
        draft_path=cfg.speculative_draft_model_path,
        pp_size=int(getattr(cfg, "pp_size", 1) or 1),
        two_batch_overlap=bool(getattr(cfg, "enable_two_batch_overlap", False)),
        num_steps=_int_or_none(getattr(cfg, "speculative_num_steps", None)),
        topk=_int_or_none(getattr(cfg, "speculative_eagle_topk", None)),
        num_draft_tokens=_int_or_none(getattr(cfg, "speculative_num_draft_tokens", None)),
        context_length=_int_or_none(getattr(cfg, "context_length", None)),
    )


def target_of(server_args: Any):
    """The served target as SGLang sees it (hub ids and overrides included)."""
    cfg = hooks.use("sglang.srt.arg_groups.model_override_base.resolving_view")(server_args)
    return _target_info(server_args, cfg)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _target_info(server_args: Any, cfg: Any):
    from eagle3_backend.target import TargetInfo

    model_config = hooks.use("sglang.srt.arg_groups.model_override_base.model_config_of")(server_args)
    return TargetInfo.from_hf_dict(model_config.hf_config.to_dict(), source=str(cfg.model_path))


@functools.cache
def process_plan() -> ServingPlan | None:
    """The plan the launcher checked, in a process of an EAGLE-3 launch (else None)."""
    text = os.environ.get(PLAN_ENV)
    return ServingPlan.from_json(text) if text else None
