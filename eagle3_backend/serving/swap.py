"""A live server's EAGLE-3 draft replaced in place, on every rank (issue 17): the scheduler side.

The launcher (``drafts._Admin``) drives one swap as a sequence of control requests, each
answered between two batches by every TP rank of every DP group (SGLang broadcasts control
requests to the TP ranks; only rank 0 answers, so every answer here is agreed over the TP
group's CPU communicator first):

``stage PATH``   each rank reads the new checkpoint's safetensors in a background thread
                 (never a pickle) and checks it against the served draft: the same tensor
                 names and shapes (complete), every float finite. Nothing served changes.
``status``       staging: all ready, still reading, or which rank failed and why.
``commit PATH``  between two batches: a CPU copy of the draft's own tensors is kept, then the
                 staged tensors go through SGLang's own ``load_weights`` into the same
                 storage (captured CUDA graphs stay valid). Parameters the draft shares with
                 the target (its embedding; a shared lm_head) are replaced by write-nothing
                 placeholders for the load, so no target weight is ever overwritten. Every
                 copy of the token map (``hot_token_id``) is refreshed in place and each
                 parameter's version bumped (caches keyed on it, such as the CPU engine's
                 packed weights, rebuild). All ranks or none: a failure on any rank restores
                 the kept copy everywhere. When the scheduler is idle the prefix cache is
                 flushed too (its draft KV was written by the old draft).
``rollback``     the kept copy and the active draft trade places (a second rollback undoes it).
``discard``      drops a staged checkpoint.

A batch runs with one set of weights: every op here runs in the scheduler thread between
batches. Requests in flight finish with target-exact outputs (verification decides every
token); their draft attention reads KV the old draft wrote for earlier positions, which can
lower their acceptance until they finish.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from eagle3_backend.errors import ServingError
from eagle3_backend.serving import drafts, hooks

logger = logging.getLogger(__name__)

_GET_PARALLEL = "sglang.srt.runtime_context.get_parallel"
_DISPATCHER = "sglang.utils.TypeBasedDispatcher"
_IDLE = "sglang.srt.managers.scheduler.Scheduler.is_fully_idle"
_FLUSH = "sglang.srt.managers.scheduler.Scheduler.flush_cache"


@dataclass
class _Staged:
    path: str
    started: float
    tensors: dict[str, Any] | None = None
    error: str | None = None
    seconds: float | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Kept:
    """A draft not serving now that a rollback restores: its tensors (CPU) and its record."""

    record: drafts.DraftRecord
    params: dict[str, Any]     # "runner_index.param_name" -> CPU copy
    hot: list[Any]             # per runner: its token map (CPU copy) or None


_STAGED: list[_Staged] = []
_KEPT: list[_Kept] = []


# --------------------------------------------------------------------------- reading
def read_checkpoint(path: str, manifest: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The tensors of the draft checkpoint at ``path`` (``checkpoint.files.read_tensors``:
    safetensors, sharded or not; a pickle is refused), checked against the served draft's
    ``manifest`` (name -> shape as SGLang's loader read it at start)."""
    import torch

    from eagle3_backend.checkpoint.files import read_tensors
    from eagle3_backend.errors import CheckpointError

    try:
        tensors, _ = read_tensors(Path(path))
    except CheckpointError as exc:
        raise ServingError(str(exc)) from None
    if manifest:
        missing, extra = sorted(set(manifest) - set(tensors)), sorted(set(tensors) - set(manifest))
        shapes = [f"{n} {list(tensors[n].shape)} (served {list(manifest[n])})"
                  for n in sorted(set(manifest) & set(tensors)) if tuple(tensors[n].shape) != tuple(manifest[n])]
        problems = ([f"missing {missing[:8]}"] if missing else []) + \
                   ([f"not in the served draft {extra[:8]}"] if extra else []) + \
                   ([f"other shapes: {', '.join(shapes[:4])}"] if shapes else [])
        if problems:
            raise ServingError(f"its tensors differ from the served draft's: {'; '.join(problems)}")
    bad = [n for n, t in sorted(tensors.items())
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ServingError(f"tensor(s) {bad[:8]} hold NaN or Inf values")
    return tensors


def _stage_worker(st: _Staged, manifest: dict[str, tuple[int, ...]]) -> None:
    try:
        st.tensors = read_checkpoint(st.path, manifest)
    except Exception as exc:
        st.error = str(exc) if isinstance(exc, ServingError) else f"{type(exc).__name__}: {exc}"
    st.seconds = round(time.time() - st.started, 3)
    st.done.set()


# --------------------------------------------------------------------- rank agreement
def _gather(scheduler: Any, value: Any) -> list[Any]:
    """``value`` from every TP rank of this scheduler's group, in rank order."""
    parallel = hooks.use(_GET_PARALLEL)()
    if int(parallel.tp_size) == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * int(parallel.tp_size)
    dist.all_gather_object(out, value, group=parallel.tp_group.cpu_group)
    return out


def _failures(values: list[Any]) -> list[str]:
    return [f"rank {i}: {v}" for i, v in enumerate(values) if v]


# ------------------------------------------------------------------- the draft's tensors
def _hot_holders(scheduler: Any) -> list[Any]:
    """The objects holding a device copy of the token map (the spec worker and its draft worker)."""
    import torch

    worker = scheduler.draft_worker
    out = []
    for obj in (worker, getattr(worker, "_draft_worker", None), getattr(worker, "draft_worker", None)):
        if obj is not None and isinstance(getattr(obj, "hot_token_id", None), torch.Tensor) and obj not in out:
            out.append(obj)
    return out


def _own_params(model: Any, shared: set[int]) -> Iterator[tuple[str, Any]]:
    return ((n, p) for n, p in model.named_parameters() if id(p) not in shared)


def _snapshot(scheduler: Any, shared: set[int]) -> tuple[dict[str, Any], list[Any]]:
    params, hot = {}, []
    for i, runner in enumerate(drafts.draft_runners(scheduler)):
        for n, p in _own_params(runner.model, shared):
            params[f"{i}.{n}"] = p.detach().to("cpu", copy=True)
        h = getattr(runner.model, "hot_token_id", None)
        hot.append(None if h is None else h.detach().to("cpu", copy=True))
    return params, hot


def _bump(p: Any) -> None:
    """SGLang's loaders write through ``param.data``, which a version-keyed cache cannot see."""
    import torch

    torch.autograd.graph.increment_version(p)


def _set_hot(scheduler: Any, model: Any, before: Any, new: Any) -> None:
    """Every copy of the token map takes ``new`` in place (the tensors captured graphs read)."""
    if new is None:
        return
    if before is not None and before is not new:
        before.copy_(new.to(before.device))
        model.hot_token_id = before  # the object the worker and its graphs were given at start
    held = model.hot_token_id
    for obj in _hot_holders(scheduler):
        if obj.hot_token_id is not held and obj.hot_token_id.shape == new.shape:
            obj.hot_token_id.copy_(new.to(obj.hot_token_id.device))


class _Placeholders:
    """While loading: the draft's target-owned parameters are swapped for meta tensors whose
    loader writes nothing (a checkpoint's embed_tokens or lm_head never reaches the target)."""

    def __init__(self, model: Any, shared: set[int]):
        self.model, self.shared, self.saved, self.skipped = model, shared, [], []

    def __enter__(self) -> "_Placeholders":
        import torch

        for name, p in list(self.model.named_parameters()):
            if id(p) not in self.shared:
                continue
            owner, _, attr = name.rpartition(".")
            module = self.model.get_submodule(owner) if owner else self.model
            stub = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
            stub.weight_loader = lambda param, w, *a, _n=name, **k: self.skipped.append(_n)
            self.saved.append((module, attr, p))
            module._parameters[attr] = stub
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, attr, p in self.saved:
            module._parameters[attr] = p


def _load(scheduler: Any, tensors: dict[str, Any], shared: set[int], path: str) -> list[str]:
    """The staged tensors into every draft runner, in place; returns the names left to the target."""
    skipped: list[str] = []
    for runner in drafts.draft_runners(scheduler):
        model = runner.model
        before = getattr(model, "hot_token_id", None)
        try:
            with _Placeholders(model, shared) as ph, drafts.swap_load(path):
                model.load_weights(iter(tensors.items()))
        except BaseException:
            model.hot_token_id = before  # _restore puts the kept values into this object
            raise
        skipped += ph.skipped
        _set_hot(scheduler, model, before, getattr(model, "hot_token_id", None))
        for _, p in _own_params(model, shared):
            _bump(p)
    return sorted(set(skipped))


def _restore(scheduler: Any, shared: set[int], params: dict[str, Any], hot: list[Any]) -> None:
    for i, runner in enumerate(drafts.draft_runners(scheduler)):
        model = runner.model
        for n, p in _own_params(model, shared):
            p.data.copy_(params[f"{i}.{n}"].to(p.device))
            _bump(p)
        _set_hot(scheduler, model, getattr(model, "hot_token_id", None), hot[i] if i < len(hot) else None)


def _nonfinite(scheduler: Any, shared: set[int]) -> list[str]:
    import torch

    return [n for runner in drafts.draft_runners(scheduler) for n, p in _own_params(runner.model, shared)
            if p.is_floating_point() and not bool(torch.isfinite(p).all())]


def _sync(scheduler: Any) -> None:
    """Waits for the device: an overlapped batch still reading the weights finishes first, and
    the next batch (launched on SGLang's own stream) sees the copies complete."""
    import torch

    p = next((p for r in drafts.draft_runners(scheduler) for p in r.model.parameters()), None)
    if p is not None and p.is_cuda:
        torch.cuda.synchronize(p.device)


def _flush(scheduler: Any) -> bool:
    """The prefix cache (target and draft KV) emptied when no rank runs anything; False otherwise.
    The ranks decide together: a cache flushed on one rank only would split their states."""
    try:
        idle = bool(hooks.use(_IDLE)(scheduler))
    except Exception:  # a flush is an improvement, never a reason to fail a committed swap
        logger.exception("eagle3_backend: reading the scheduler's idle state failed")
        idle = False
    if not all(_gather(scheduler, idle)):
        return False
    return bool(hooks.use(_FLUSH)(scheduler, empty_cache=False))


# ---------------------------------------------------------------------------- the ops
def after_init_request_dispatcher(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER Scheduler.init_request_dispatcher: answer this plugin's requests between batches."""
    types = drafts.message_types()

    def answer(req: Any) -> Any:
        try:
            body = handle(scheduler, req.op, req.path)
        except Exception as exc:  # a draft request must never stop the scheduler
            logger.exception("eagle3_backend: draft op %s failed in the scheduler", req.op)
            body = {"error": f"eagle3_backend: draft op {req.op} failed: {type(exc).__name__}: {exc}"}
        return types.out(payload=json.dumps(body))

    scheduler._request_dispatcher += hooks.use(_DISPATCHER)([(types.req, answer)])
    return None


def draft_info(scheduler: Any) -> dict[str, Any]:
    """GET /eagle3/draft's body, from this scheduler."""
    rec = drafts.active()
    if rec is None:
        return {"error": "eagle3_backend: this scheduler has not loaded its EAGLE-3 draft yet."}
    digest, count = drafts.weights_digest(drafts.draft_tensors(scheduler))
    return {"path": rec.path, "layout": rec.layout, "kept": kept_path(), "weights_sha256": digest,
            "weights_tensors": count, "loaded_at": rec.loaded_at, "acceptance": drafts.acceptance(rec)}


def handle(scheduler: Any, op: str, path: str) -> dict[str, Any]:
    """One control request from the launcher; the answer is this rank's (agreed where it matters)."""
    if op == "info":
        return draft_info(scheduler)
    if op == "stage":
        return _op_stage(path)
    if op == "status":
        return _op_status(scheduler, path)
    if op == "commit":
        return _op_commit(scheduler, path)
    if op == "rollback":
        return _op_rollback(scheduler)
    if op == "discard":
        _STAGED.clear()
        return {"ok": True}
    return {"error": f"eagle3_backend: unknown draft op {op!r}"}


def _op_stage(path: str) -> dict[str, Any]:
    rec = drafts.active()
    if _STAGED and not _STAGED[0].done.is_set():
        return {"ok": False, "error": f"still staging {_STAGED[0].path}"}
    st = _Staged(path=path, started=time.time())
    _STAGED[:] = [st]
    threading.Thread(target=_stage_worker, args=(st, dict(rec.manifest) if rec else {}),
                     name="eagle3-draft-stage", daemon=True).start()
    return {"ok": True}


def _op_status(scheduler: Any, path: str) -> dict[str, Any]:
    st = _STAGED[0] if _STAGED else None
    if st is None or st.path != path:
        mine: Any = ("failed", f"nothing staged for {path}")
    elif not st.done.is_set():
        mine = ("reading", None)
    else:
        mine = ("failed", st.error) if st.error else ("ready", st.seconds)
    states = _gather(scheduler, mine)
    failed = [f"rank {i}: {msg}" for i, (s, msg) in enumerate(states) if s == "failed"]
    if failed:
        return {"state": "failed", "errors": failed}
    if any(s == "reading" for s, _ in states):
        return {"state": "reading"}
    return {"state": "ready", "ranks": len(states), "seconds": max(float(x) for _, x in states)}


def _op_commit(scheduler: Any, path: str) -> dict[str, Any]:
    st = _STAGED[0] if _STAGED else None
    ready = st is not None and st.path == path and st.tensors is not None
    failed = _failures(_gather(scheduler, None if ready else f"{path} is not staged on this rank"))
    if failed:
        return {"ok": False, "stage": "stage", "errors": failed}
    started = time.time()
    shared = drafts.target_param_ids(scheduler)
    old = drafts.active()
    _sync(scheduler)
    params, hot = _snapshot(scheduler, shared)
    skipped: list[str] = []
    error = None
    try:
        skipped = _load(scheduler, st.tensors, shared, path)
        _sync(scheduler)
        bad = _nonfinite(scheduler, shared)
        if bad:
            error = f"parameter(s) {bad[:6]} are not finite after the load"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    failed = _failures(_gather(scheduler, error))
    if failed:
        _restore(scheduler, shared, params, hot)
        _sync(scheduler)
        _STAGED.clear()
        logger.error("eagle3_backend: draft swap to %s failed on %s; every rank kept %s", path,
                     "; ".join(failed), old.path if old else "the served draft")
        return {"ok": False, "stage": "commit", "errors": failed}
    manifest = drafts.swap_manifest() or {n: tuple(t.shape) for n, t in st.tensors.items()}
    if old is not None:
        _KEPT[:] = [_Kept(record=old, params=params, hot=hot)]
    drafts.record_load(path, old.layout if old else "", manifest)
    _STAGED.clear()
    return {"ok": True, "seconds": round(time.time() - started, 3), "left_to_target": skipped,
            "cache_flushed": _flush(scheduler)}


def _op_rollback(scheduler: Any) -> dict[str, Any]:
    kept = _KEPT[0] if _KEPT else None
    failed = _failures(_gather(scheduler, None if kept else "no previous draft is kept"))
    if failed:
        return {"ok": False, "errors": failed}
    shared = drafts.target_param_ids(scheduler)
    current = drafts.active()
    _sync(scheduler)
    params, hot = _snapshot(scheduler, shared)
    _restore(scheduler, shared, kept.params, kept.hot)
    _sync(scheduler)
    if current is not None:
        _KEPT[:] = [_Kept(record=current, params=params, hot=hot)]
    drafts.record_load(kept.record.path, kept.record.layout, kept.record.manifest)
    return {"ok": True, "path": kept.record.path, "cache_flushed": _flush(scheduler)}


def kept_path() -> str | None:
    return _KEPT[0].record.path if _KEPT else None

