"""Draft weights on a live server (issue 17): the guard, the info route, the swap and rollback.

Through the ``draft`` and ``draft-http`` rows of ``hooks.HOOKS`` only:

* **The /update_weights_from_disk guard** (scheduler). Stock SGLang 0.5.23 loads the
  path it is given into the target *and then every draft runner*
  (``SchedulerWeightUpdaterManager.update_weights_from_disk`` over ``_select_runners("all")``);
  for an EAGLE-3 draft that means the target's checkpoint goes through the draft's
  ``load_weights`` (its layer 0, norm, lm_head names match the target's), which crashes the
  scheduler or silently corrupts the draft. With this plugin serving EAGLE-3 the call
  updates the target only and says so in its message; a path that is itself an EAGLE-3 draft
  checkpoint is refused before anything is read, naming ``/eagle3/draft/swap``.
* **GET /eagle3/draft** (admin route, SGLang's API-key rules): the active draft's path,
  layout, SHA-256 of its own weights as they are in memory now, load time, acceptance
  since load counted from the scheduler's own ``update_spec_metrics`` calls, and the draft
  kept for a rollback.
* **POST /eagle3/draft/swap {"path": DIR, ...}**: (1) the start-up checks on the running
  target (``checks.check_launch``, the suite's words), then the same layout and every
  shape-affecting config field, else a refusal with the exact restart command; (2) canary
  probes with the serving draft (greedy; the bundled MT-Bench first turns unless the body
  gives texts or input ids); (3) staging, commit, all ranks or none (``swap.py``); (4) the
  same probes with the new draft: worse acceptance than before by more than ``margin``
  rolls back to the kept copy (unless ``keep_if_worse``). One swap at a time (409).
* **POST /eagle3/draft/rollback**: the kept draft and the serving one trade places.

Which processes: the launcher verifies both groups after its pre-load checks and hands the
verdict to its schedulers in ``$EAGLE3_DRAFT_ADMIN`` (like the serving plan); a missing or
changed target turns this feature off with one log line and never stops the server. The
launcher registers the ``draft-http`` row at plugin load (main process only), the schedulers
of an EAGLE-3 launch the ``draft`` rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from eagle3_backend.errors import Eagle3Error, ServingError
from eagle3_backend.serving import checks, hooks

logger = logging.getLogger(__name__)

#: Set by the launcher for its schedulers: "1" when every ``draft``/``draft-http`` row is present.
DRAFT_ENV = "EAGLE3_DRAFT_ADMIN"
INFO_ROUTE = "/eagle3/draft"
SWAP_ROUTE = "/eagle3/draft/swap"
ROLLBACK_ROUTE = "/eagle3/draft/rollback"
FEATURE = (f"the live-draft admin ({INFO_ROUTE}, {SWAP_ROUTE}, {ROLLBACK_ROUTE}, the "
           "/update_weights_from_disk guard)")

_HTTP_SETUP = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
_APP = "sglang.srt.entrypoints.http_server.app"
_AUTH_LEVEL = "sglang.srt.utils.auth.auth_level"
_AUTH_ENUM = "sglang.srt.utils.auth.AuthLevel"
_BASE_REQ = "sglang.srt.managers.io_struct.BaseReq"
_CUSTOM_TYPES = "sglang.srt.managers.io_struct.hook_custom_types"
_DISK_OUT = "sglang.srt.managers.io_struct.UpdateWeightFromDiskReqOutput"
_DISPATCHER = "sglang.utils.TypeBasedDispatcher"
_COMMUNICATOR = "sglang.srt.managers.communicator.FanOutCommunicator"
_TM_DISPATCH = "sglang.srt.managers.tokenizer_manager.TokenizerManager._dispatch_to_scheduler"
_TM_LOOP = "sglang.srt.managers.tokenizer_manager.TokenizerManager.auto_create_handle_loop"
_GET_PARALLEL = "sglang.srt.runtime_context.get_parallel"
_DRAFT_RUNNERS = "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.weight_update_runners"
_TARGET_RUNNERS = "sglang.srt.managers.tp_worker.TpModelWorker.weight_update_runners"

_GEN_REQ = "sglang.srt.managers.io_struct.GenerateReqInput"
_TM_GENERATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"

INFO_TIMEOUT = 120.0
STAGE_TIMEOUT = 600.0
#: The swap's defaults: bundled MT-Bench first turns as canary probes, greedy, this many tokens,
#: and the acceptance (tokens per verify step) the new draft may lose before it is rolled back.
PROBE_PROMPTS, PROBE_TOKENS, MARGIN = 8, 32, 0.05


# ------------------------------------------------------------------------- feature switch
def feature_problems() -> list[str]:
    """What the installed SGLang lacks for this feature (empty: it can be on)."""
    return hooks.verify("draft-http") + hooks.verify("draft")


def off_line(problem: str) -> str:
    """The one line logged when this feature is off; the server keeps serving."""
    return (f"eagle3_backend: SGLang {hooks.sglang_version()} {problem}; {FEATURE} is off on this "
            f"server (built for SGLang {hooks.SUPPORTED_SGLANG}); EAGLE-3 serving is unaffected, and "
            f"/update_weights_from_disk keeps SGLang's own behaviour (it also loads the path into the draft).")


def decide_in_launcher() -> bool:
    """In the launcher of a checked EAGLE-3 launch: turn the feature on or off for every process."""
    problems = feature_problems()
    if problems:
        os.environ.pop(DRAFT_ENV, None)
        logger.warning("%s", off_line(problems[0]))
        return False
    os.environ[DRAFT_ENV] = "1"
    return True


def enabled() -> bool:
    return bool(os.environ.get(checks.PLAN_ENV)) and os.environ.get(DRAFT_ENV) == "1"


# ------------------------------------------------------------------------- message types
@dataclass(frozen=True, slots=True)
class _Types:
    req: type
    out: type


@functools.cache
def message_types() -> _Types:
    """The IPC messages (msgspec structs under SGLang's BaseReq; the tag is the class name):
    one request ``op`` (info, stage, status, commit, rollback, discard: ``swap.handle``) with
    its ``path``, one JSON answer."""
    base = hooks.use(_BASE_REQ)

    class Eagle3DraftReqInput(base, kw_only=True):
        op: str
        path: str = ""

    class Eagle3DraftReqOutput(base, kw_only=True):
        payload: str  # JSON

    types = _Types(Eagle3DraftReqInput, Eagle3DraftReqOutput)
    for cls in (types.req, types.out):  # module-level names: SGLang's pickle IPC finds them by name
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls
    hooks.use(_CUSTOM_TYPES)(types.req, types.out)  # and its msgpack IPC decodes them from now on
    return types


_TYPE_NAMES = ("Eagle3DraftReqInput", "Eagle3DraftReqOutput")


def __getattr__(name: str) -> Any:
    """An unpickling process builds the message types on first use."""
    if name in _TYPE_NAMES:
        message_types()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------ scheduler: the record
@dataclass
class DraftRecord:
    """The draft this scheduler serves: where from, when, and its acceptance since then."""

    path: str
    layout: str
    loaded_at: float
    manifest: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # name -> shape
    verify_steps: int = 0
    accepted_tokens: int = 0
    correct_drafts: int = 0


_LOCK = threading.Lock()
_ACTIVE: list[DraftRecord] = []


def record_load(path: str, layout: str, manifest: dict[str, tuple[int, ...]] | None = None) -> None:
    """Called when the draft's weights were loaded (and checked): acceptance starts over."""
    with _LOCK:
        _ACTIVE[:] = [DraftRecord(path=str(path), layout=str(layout), loaded_at=time.time(),
                                  manifest=dict(manifest or {}))]


_SWAP_LOAD = threading.local()  # set while swap.py loads a new draft into the running one


@contextlib.contextmanager
def swap_load(path: str) -> Iterator[None]:
    """Marks a load as a swap's: the load hook then leaves the record to the swap."""
    _SWAP_LOAD.path, _SWAP_LOAD.manifest = path, None
    try:
        yield
    finally:
        _SWAP_LOAD.path = None


def swap_manifest() -> dict[str, tuple[int, ...]] | None:
    """The tensor names and shapes SGLang's loader read in the last swap load."""
    return getattr(_SWAP_LOAD, "manifest", None)


def after_draft_load(manifest: dict[str, tuple[int, ...]]) -> None:
    """Called by the draft load hook once SGLang consumed every tensor."""
    if getattr(_SWAP_LOAD, "path", None):
        _SWAP_LOAD.manifest = manifest
        return
    plan = checks.process_plan()
    record_load(plan.draft_path, str(plan.layout), manifest)


def active() -> DraftRecord | None:
    with _LOCK:
        return _ACTIVE[0] if _ACTIVE else None


def after_update_spec_metrics(result: Any, reporter: Any, bs: Any, num_correct_drafts: Any,
                              num_accept_tokens: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER SchedulerMetricsReporter.update_spec_metrics: count verify steps since the load."""
    rec = active()
    if rec is not None:
        with _LOCK:
            rec.verify_steps += int(bs)
            rec.accepted_tokens += int(num_accept_tokens)
            rec.correct_drafts += int(num_correct_drafts)
    return None


def acceptance(rec: DraftRecord) -> dict[str, Any]:
    """The record's acceptance since its load (read under the lock the metrics hook takes)."""
    with _LOCK:
        steps, accepted, correct = rec.verify_steps, rec.accepted_tokens, rec.correct_drafts
    return {"verify_steps": steps, "accepted_tokens": accepted, "correct_drafts": correct,
            "accept_length": round(accepted / steps, 6) if steps else None}


def weights_digest(named: Iterable[tuple[str, Any]]) -> tuple[str, int]:
    """SHA-256 over (name, dtype, shape, bytes) of each tensor in name order; and their count."""
    import torch

    h = hashlib.sha256()
    n = 0
    for name, tensor in sorted(named, key=lambda item: item[0]):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        n += 1
    return h.hexdigest(), n


def draft_runners(scheduler: Any) -> list[Any]:
    """The scheduler's draft model runners (role 'draft' of the spec worker)."""
    return [r for role, r in scheduler.draft_worker.weight_update_runners() if role == "draft"]


def target_param_ids(scheduler: Any) -> set[int]:
    """ids of the target's parameter objects; the draft shares some (embed_tokens, a shared lm_head)."""
    ids: set[int] = set()
    for _, runner in scheduler.tp_worker.weight_update_runners():
        ids |= {id(p) for p in runner.model.parameters()}
    return ids


def draft_tensors(scheduler: Any) -> list[tuple[str, Any]]:
    """The draft's own tensors: its parameters that are not the target's parameter objects,
    and the token map it serves (``hot_token_id``, from d2t)."""
    shared = target_param_ids(scheduler)
    runners = draft_runners(scheduler)
    out = []
    for i, runner in enumerate(runners):
        prefix = f"{i}." if len(runners) > 1 else ""
        model = runner.model
        out += [(prefix + n, p) for n, p in model.named_parameters() if id(p) not in shared]
        hot = getattr(model, "hot_token_id", None)
        if hot is not None:
            out.append((prefix + "hot_token_id", hot))
    return out


# ------------------------------------------------------ scheduler: /update_weights_from_disk
_TARGET_ONLY = threading.local()


def draft_checkpoint_arches(path: str) -> list[str]:
    """The EAGLE-3 draft ``architectures`` a checkpoint dir declares ([]: not a draft, or unreadable)."""
    from eagle3_backend.checkpoint.names import DRAFT_ARCHS

    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    arches = raw.get("architectures") if isinstance(raw, dict) else None
    return [a for a in arches if a in DRAFT_ARCHS] if isinstance(arches, list) else []


def disk_refusal(path: str, arches: list[str]) -> str:
    return (f"eagle3_backend: {path} is an EAGLE-3 draft checkpoint (architectures {arches}); "
            f"/update_weights_from_disk loads the target's weights and would put it into the "
            f"target. Nothing was changed. To change the draft, POST {SWAP_ROUTE} "
            f'{{"path": "{path}"}}.')


def disk_note(draft_path: str) -> str:
    return (f"eagle3_backend: updated the target only; the EAGLE-3 draft {draft_path} was kept "
            f"(SGLang {hooks.SUPPORTED_SGLANG} would also load the target's checkpoint into the "
            f"draft). Change the draft with POST {SWAP_ROUTE}.")


def around_update_weights_from_disk(original: Callable[..., Any], manager: Any, recv_req: Any,
                                    *args: Any, **kwargs: Any) -> Any:
    """AROUND SchedulerWeightUpdaterManager.update_weights_from_disk: the target only."""
    from eagle3_backend.serving.checks import process_plan

    plan = process_plan()
    if plan is None:
        return original(manager, recv_req, *args, **kwargs)
    path = str(recv_req.model_path)
    arches = draft_checkpoint_arches(path)
    if arches:
        message = disk_refusal(path, arches)
        logger.error("%s", message)
        return hooks.use(_DISK_OUT)(success=False, message=message, num_paused_requests=0)
    _TARGET_ONLY.on = True
    try:
        out = original(manager, recv_req, *args, **kwargs)
    finally:
        _TARGET_ONLY.on = False
    rec = active()
    draft_path = rec.path if rec is not None else plan.draft_path
    if out.success:
        out.message = f"{out.message} {disk_note(draft_path)}"
    else:
        out.message = f"{out.message} (eagle3_backend: the EAGLE-3 draft {draft_path} was not touched.)"
    logger.info("eagle3_backend: /update_weights_from_disk %s: %s; kept the EAGLE-3 draft %s",
                path, "target updated" if out.success else "failed", draft_path)
    return out


def around_select_runners(original: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND SchedulerWeightUpdaterManager._select_runners: no draft runner inside the guard."""
    runners = original(manager, *args, **kwargs)
    if getattr(_TARGET_ONLY, "on", False):
        return [(role, runner) for role, runner in runners if role != "draft"]
    return runners


# ------------------------------------------------------------------ launcher: swap checks
#: DraftConfig fields a swap in place cannot change: SGLang built the draft's modules from
#: them at start (shapes, norms, rope, activation). ``dtype`` (the server casts on load) and
#: ``has_embed_tokens`` (the served embedding is the target's) are not among them.
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size",
                "num_hidden_layers", "rms_norm_eps", "rope_theta", "rope_scaling",
                "max_position_embeddings", "hidden_act", "attention_bias", "fc_bias",
                "norm_before_fc", "fc_norm", "norm_before_residual", "norm_output",
                "tie_word_embeddings")


#: environment variables that shape a launch and are repeated in the restart command (never
#: a key or a token: the command is sent back to whoever asked for the swap)
RESTART_ENV = ("SGLANG_USE_CPU_ENGINE", "SGLANG_CPU_OMP_THREADS_BIND", "SGLANG_PLUGINS")


def restart_command(argv: list[str] | None, draft: str, env: Mapping[str, str] | None = None) -> str:
    """The launch command (``python -m sglang.launch_server`` or ``sglang serve``) with
    ``--speculative-draft-model-path`` set to ``draft``, after the :data:`RESTART_ENV` variables
    set in ``env`` (this process's environment by default)."""
    flag = "--speculative-draft-model-path"
    argv = list(argv or [])
    if argv and str(argv[0]).replace("\\", "/").endswith("sglang/launch_server.py"):
        head, args = "python -m sglang.launch_server", argv[1:]
    elif len(argv) > 1 and os.path.basename(str(argv[0])) == "sglang" and argv[1] == "serve":
        head, args = "sglang serve", argv[2:]
    else:
        return f"your launch command with {flag} {shlex.quote(draft)}"
    out, i, done = [], 0, False
    while i < len(args):
        a = args[i]
        if a == flag and i + 1 < len(args):
            out += [flag, draft]
            i, done = i + 2, True
            continue
        if a.startswith(flag + "="):
            out.append(f"{flag}={draft}")
            done = True
        else:
            out.append(a)
        i += 1
    if not done:
        out += [flag, draft]
    env = os.environ if env is None else env
    prefix = "".join(f"{k}={shlex.quote(env[k])} " for k in RESTART_ENV if env.get(k))
    return prefix + head + " " + shlex.join(out)


@dataclass(frozen=True, slots=True)
class SwapVerdict:
    status: int  # HTTP status
    body: dict[str, Any]


def _refused(stage: str, message: str, status: int = 400, **extra: Any) -> SwapVerdict:
    return SwapVerdict(status, {"success": False, "stage": stage, "message": message, **extra})


def judge_swap(current: Any, launch: checks.LaunchArgs, target: Any, path: str,
               argv: list[str] | None) -> SwapVerdict | None:
    """Can the draft at ``path`` replace ``current`` (a ServingPlan) on this running target?
    None when it can; else the refusal. Nothing is loaded into the server here."""
    from eagle3_backend.checkpoint.read import load_draft

    cmd = restart_command(argv, path)
    try:
        new = checks.check_launch(dataclasses.replace(launch, draft_path=path), target)
    except Eagle3Error as exc:
        text = str(exc).replace(checks.REFUSES, f"eagle3_backend refuses the swap to {path}", 1)
        return _refused("validate", text)
    if new is None:  # not reachable for EAGLE3 with a path; be explicit anyway
        return _refused("validate", f"eagle3_backend refuses the swap to {path}: no serving plan.")
    if new.layout != current.layout:
        return _refused("compatibility", (
            f"eagle3_backend refuses the swap to {path}: its layout is {new.layout} but this "
            f"server captures {current.layout} for draft {current.draft_path}; the target's "
            f"capture is fixed at start, so a swap keeps the layout. Restart with: {cmd}"),
            restart_command=cmd)
    try:
        old_cfg = load_draft(current.draft_path, target=target, strict=False).config
        new_cfg = load_draft(path, target=target, strict=False).config
    except Eagle3Error as exc:
        return _refused("validate", f"eagle3_backend refuses the swap to {path}: {exc}")
    diffs = [f"{f} {_value(old_cfg, f)} -> {_value(new_cfg, f)}" for f in SHAPE_FIELDS
             if _value(old_cfg, f) != _value(new_cfg, f)]
    if diffs:
        return _refused("compatibility", (
            f"eagle3_backend refuses the swap to {path}: it differs from the served draft "
            f"{current.draft_path} in {', '.join(diffs)}; SGLang built the draft's modules from "
            f"these at start, so a swap in place cannot change them. Restart with: {cmd}"),
            restart_command=cmd)
    return None


def _value(cfg: Any, name: str) -> Any:
    if name == "head_dim":
        return cfg.head_dim if cfg.head_dim is not None else cfg.hidden_size // cfg.num_attention_heads
    value = getattr(cfg, name)
    return value if value is None or isinstance(value, (int, float, str, bool)) else str(value)


# ------------------------------------------------------------------------- launcher: routes
@functools.cache
def _http_param(name: str) -> int:
    return hooks.param_index(_HTTP_SETUP, name)


def _arg(args: tuple, kwargs: dict, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    pos = _http_param(name)
    return args[pos] if len(args) > pos else None


def before_setup_http_server(*args: Any, **kwargs: Any) -> None:
    """BEFORE http_server._setup_and_run_http_server: add the admin routes to SGLang's app."""
    if not enabled():
        return None
    server_args = _arg(args, kwargs, "server_args")
    tm = _arg(args, kwargs, "tokenizer_manager")
    if tm is None or int(getattr(server_args, "tokenizer_worker_num", 1) or 1) != 1:
        logger.warning("eagle3_backend: %s and %s need one tokenizer process (--tokenizer-worker-num "
                       "1) and an HTTP server; not added", INFO_ROUTE, SWAP_ROUTE)
        return None
    add_routes(hooks.use(_APP), _Admin(server_args, tm, list(sys.argv)))
    return None


class _Admin:
    """The launcher side of the routes: talks to the schedulers, drives a swap."""

    def __init__(self, server_args: Any, tokenizer_manager: Any, argv: list[str]):
        self.server_args, self.tm, self.argv = server_args, tokenizer_manager, argv
        self._comm: Any = None
        self._swap_lock = asyncio.Lock()
        plan = checks.process_plan()
        self.active_path = plan.draft_path if plan is not None else ""

    def _communicator(self) -> Any:
        if self._comm is None:
            types = message_types()
            hooks.use(_TM_LOOP)(self.tm)  # the receive loop runs before the first generate, too
            fan_out = int(hooks.use(_GET_PARALLEL)().num_dp_ranks)
            self._comm = hooks.use(_COMMUNICATOR)(
                functools.partial(hooks.use(_TM_DISPATCH), self.tm), fan_out)
            self.tm._result_dispatcher += hooks.use(_DISPATCHER)([(types.out, self._comm.handle_recv)])
        return self._comm

    async def op(self, op: str, path: str = "", timeout: float = INFO_TIMEOUT) -> list[dict[str, Any]]:
        """One draft op on every DP group's schedulers; their answers."""
        results = await asyncio.wait_for(self._communicator()(message_types().req(op=op, path=path)), timeout)
        return [json.loads(r.payload) for r in results]

    async def info(self) -> tuple[int, dict[str, Any]]:
        bodies = await self.op("info")
        body = bodies[0] if len(bodies) == 1 else {"dp_ranks": bodies}
        return (500 if any("error" in b for b in bodies) else 200), body

    async def swap(self, body: Any) -> tuple[int, dict[str, Any]]:
        req = _swap_request(body)
        if isinstance(req, SwapVerdict):
            return req.status, req.body
        if self._swap_lock.locked():
            v = _refused("request", f"eagle3_backend: a draft swap is already running; {req.path} was "
                                    f"not considered. Retry when it has finished.", status=409)
            return v.status, v.body
        async with self._swap_lock:
            try:
                v = await self._swap(req)
            except Exception as exc:  # the route answers; the server keeps serving
                logger.exception("eagle3_backend: draft swap to %s failed", req.path)
                v = _refused("error", f"eagle3_backend: the swap to {req.path} failed: {type(exc).__name__}: "
                             f"{exc}; {self.active_path} serves (GET {INFO_ROUTE} shows it).", status=500)
        plan = checks.process_plan()
        logger.info("eagle3_backend: draft swap %s -> %s (layout %s): %s; %s",
                    v.body.get("previous") if v.body.get("success") else self.active_path, req.path,
                    plan.layout if plan is not None else "?", v.body["stage"], v.body["message"])
        return v.status, v.body

    async def _swap(self, req: "_SwapRequest") -> SwapVerdict:
        old = self.active_path
        v = await asyncio.to_thread(self._judge, req.path)
        if v is not None:
            return v
        logger.info("eagle3_backend: draft swap %s -> %s: validated; %s", old, req.path,
                    f"{req.probes} canary probes of {req.tokens} tokens" if req.probes else "no canary")
        try:
            before = await self._probe(req) if req.probes else None
        except ServingError as exc:
            return _refused("request", f"eagle3_backend refuses the swap to {req.path}: {exc}")
        served = [i.get("acceptance") for i in await self.op("info")]  # the old draft, since its load
        started = time.time()
        if not all(r.get("ok") for r in await self.op("stage", req.path)):
            return _refused("stage", f"eagle3_backend: another staging is still running; {old} still serves.",
                            status=409)
        while True:
            states = await self.op("status", req.path)
            if any(s.get("state") == "failed" for s in states):
                await self.op("discard")
                errors = [e for s in states for e in s.get("errors", [])]
                return _refused("stage", f"eagle3_backend refuses the swap to {req.path}: "
                                f"{'; '.join(errors)}. Nothing changed; {old} still serves.")
            if all(s.get("state") == "ready" for s in states):
                ranks = sum(int(s["ranks"]) for s in states)
                break
            if time.time() - started > STAGE_TIMEOUT:
                await self.op("discard")
                return _refused("stage", f"eagle3_backend: staging {req.path} took over {STAGE_TIMEOUT:.0f} s; "
                                f"nothing changed; {old} still serves.", status=504)
            await asyncio.sleep(0.1)
        staged_s = round(time.time() - started, 3)
        commits = await self.op("commit", req.path)
        if not all(c.get("ok") for c in commits):
            errors = [e for c in commits for e in c.get("errors", [c.get("error", "")])]
            return _refused("commit", f"eagle3_backend: committing {req.path} failed ({'; '.join(errors)}); "
                            f"every rank restored {old}, which still serves.", status=500)
        self.active_path = req.path
        out: dict[str, Any] = {
            "success": True, "stage": "live", "path": req.path, "previous": old, "validated": True,
            "previous_acceptance": served[0] if len(served) == 1 else served,
            "staged": {"seconds": staged_s, "ranks": ranks}, "committed": {
                "seconds": max(c["seconds"] for c in commits),
                "cache_flushed": all(c["cache_flushed"] for c in commits),
                "left_to_target": sorted({n for c in commits for n in c["left_to_target"]})}}
        if before is None:
            out["message"] = f"eagle3_backend: {req.path} serves now (no canary probes asked); {old} is kept for {ROLLBACK_ROUTE}."
            return SwapVerdict(200, out)
        after = await self._probe(req)
        a, b = before["accept_length"], after["accept_length"]
        worse = a is None or b is None or b < a - req.margin  # unmeasured counts as worse
        canary = {"prompts": len(before["outputs"]), "max_new_tokens": req.tokens, "margin": req.margin,
                  "accept_length_before": a, "accept_length_after": b,
                  "unmeasured": [before["unmeasured"], after["unmeasured"]],
                  "outputs_identical": before["outputs"] == after["outputs"]}
        out["canary"] = canary
        fig = (f"acceptance on {canary['prompts']} probe prompts {fmt_accept(a)} -> {fmt_accept(b)}"
               + (f"; {before['unmeasured']} / {after['unmeasured']} probes came back without speculative "
                  f"metrics" if before["unmeasured"] or after["unmeasured"] else ""))
        if worse and not req.keep_if_worse:
            back = await self.op("rollback")
            if not all(r.get("ok") for r in back):
                errors = [e for r in back for e in r.get("errors", [])]
                out.update(success=False, stage="rollback-failed", message=(
                    f"eagle3_backend: {req.path} did worse ({fig}) and rolling back failed "
                    f"({'; '.join(errors)}); {req.path} still serves."))
                return SwapVerdict(500, out)
            self.active_path = old
            canary["verdict"] = "rolled back"
            out.update(success=False, stage="rolled-back", message=(
                f"eagle3_backend: {req.path} did worse than {old} ({fig}, margin {req.margin}); rolled "
                f"back, {old} serves. Send keep_if_worse to keep it anyway."))
            return SwapVerdict(422, out)
        canary["verdict"] = "kept despite worse" if worse else "kept"
        out["message"] = (f"eagle3_backend: {req.path} serves now ({fig}); {old} is kept for {ROLLBACK_ROUTE}.")
        return SwapVerdict(200, out)

    async def rollback(self) -> tuple[int, dict[str, Any]]:
        if self._swap_lock.locked():
            v = _refused("request", "eagle3_backend: a draft swap is running; roll back when it has finished.",
                         status=409)
            return v.status, v.body
        async with self._swap_lock:
            answers = await self.op("rollback")
            if not all(a.get("ok") for a in answers):
                errors = [e for a in answers for e in a.get("errors", [])]
                return 409, {"success": False, "stage": "rollback",
                             "message": f"eagle3_backend: nothing rolled back ({'; '.join(errors)}); "
                                        f"{self.active_path} still serves."}
            old, self.active_path = self.active_path, answers[0]["path"]
        logger.info("eagle3_backend: draft rollback %s -> %s", old, self.active_path)
        return 200, {"success": True, "stage": "live", "path": self.active_path, "previous": old,
                     "message": f"eagle3_backend: rolled back; {self.active_path} serves, {old} is kept."}

    def _judge(self, path: str) -> SwapVerdict | None:
        unsupported = unsupported_parallelism(self.server_args)
        if unsupported:
            cmd = restart_command(self.argv, path)
            return _refused("compatibility", (
                f"eagle3_backend refuses the swap to {path}: a live swap is not built for "
                f"{' and '.join(unsupported)} (not every rank would receive its control requests); "
                f"nothing changed, {self.active_path} still serves. Restart with: {cmd}"), restart_command=cmd)
        current = dataclasses.replace(checks.process_plan(), draft_path=self.active_path)
        launch, target = checks.launch_args(self.server_args), checks.target_of(self.server_args)
        return judge_swap(current, launch, target, path, self.argv)

    async def _probe(self, req: "_SwapRequest") -> dict[str, Any]:
        """The probe prompts, greedy, all at once: SGLang's own accept length over them and the outputs."""
        gen = hooks.use(_GEN_REQ)

        async def one(prompt: dict[str, Any]) -> dict[str, Any]:
            obj = gen(**prompt, sampling_params={"temperature": 0.0, "max_new_tokens": req.tokens})
            out: dict[str, Any] = {}
            async for out in self.tm.generate_request(obj, None):
                pass
            return out

        outs = await asyncio.gather(*(one(p) for p in _probe_inputs(req, self.tm)))
        measured = [o["meta_info"] for o in outs if int(o["meta_info"].get("spec_verify_ct") or 0) > 0]
        steps = sum(int(m["spec_verify_ct"]) for m in measured)
        tokens = sum(int(m["completion_tokens"]) for m in measured)
        return {"accept_length": round(tokens / steps, 4) if steps else None,
                "unmeasured": len(outs) - len(measured),
                "outputs": [o.get("output_ids", o.get("text")) for o in outs]}


def unsupported_parallelism(server_args: Any) -> list[str]:
    """The launch settings under which the swap's rank agreement does not hold."""
    out = []
    if getattr(server_args, "enable_dp_attention", False):
        out.append("--enable-dp-attention")
    if int(getattr(server_args, "pp_size", 1) or 1) > 1:
        out.append(f"--pp-size {server_args.pp_size}")
    return out


def fmt_accept(value: float | None) -> str:
    """A canary acceptance length as the swap's messages and `eagle3 swap` print it."""
    return "unmeasured" if value is None else f"{value:.3f}"


@dataclass(frozen=True, slots=True)
class _SwapRequest:
    path: str
    probes: int
    tokens: int
    margin: float
    keep_if_worse: bool
    texts: tuple[str, ...] | None
    input_ids: tuple[tuple[int, ...], ...] | None


def _swap_request(body: Any) -> "_SwapRequest | SwapVerdict":
    """The swap body: {"path": DIR, "probe_prompts": N, "probe_texts": [...] or "probe_input_ids":
    [[...], ...], "probe_tokens": K, "margin": M, "keep_if_worse": bool}; a bad one is refused by name."""
    def bad(why: str) -> SwapVerdict:
        return _refused("request", f"eagle3_backend: {SWAP_ROUTE} {why}; got {str(body)[:200]}.")

    path = body.get("path") if isinstance(body, dict) else None
    if not isinstance(path, str) or not path:
        return bad('expects a JSON body {"path": DIR}')
    known = {"path", "probe_prompts", "probe_texts", "probe_input_ids", "probe_tokens", "margin",
             "keep_if_worse"}
    if set(body) - known:
        return bad(f"does not know {sorted(set(body) - known)} (it takes {sorted(known)})")
    texts = body.get("probe_texts")
    if texts is not None and (not isinstance(texts, list) or not all(isinstance(t, str) and t for t in texts)):
        return bad("expects probe_texts as a list of non-empty strings")
    ids = body.get("probe_input_ids")
    if ids is not None and (texts is not None or not isinstance(ids, list) or not all(
            isinstance(r, list) and r and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                              for i in r) for r in ids)):
        return bad("expects probe_input_ids as a list of non-empty lists of token ids (not with probe_texts)")
    given = texts or ids
    probes = body.get("probe_prompts", len(given) if given else PROBE_PROMPTS)
    tokens, margin = body.get("probe_tokens", PROBE_TOKENS), body.get("margin", MARGIN)
    keep = body.get("keep_if_worse", False)
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 0:
        return bad("expects probe_prompts as an integer >= 0 (0: no canary)")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 4096:
        return bad("expects probe_tokens as an integer in [1, 4096]")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0:
        return bad("expects margin as a number >= 0 (accepted tokens per verify step)")
    if not isinstance(keep, bool):
        return bad("expects keep_if_worse as true or false")
    return _SwapRequest(path, probes, tokens, float(margin), keep, tuple(texts) if texts else None,
                        tuple(tuple(r) for r in ids) if ids else None)


def _probe_inputs(req: _SwapRequest, tm: Any) -> list[dict[str, Any]]:
    """The canary's prompts (``probe_prompts`` of them, cycled): the request's input ids, its
    texts, or the bundled MT-Bench first turns; texts in the served chat template when there is one."""
    if req.input_ids:
        return [{"input_ids": list(req.input_ids[i % len(req.input_ids)])} for i in range(req.probes)]
    tok = getattr(tm, "tokenizer", None)
    if tok is None:
        raise ServingError(f"this server has no tokenizer (--skip-tokenizer-init), so its canary "
                           f"needs probe_input_ids (or probe_prompts 0); nothing changed.")
    if req.texts:
        texts = list(req.texts)
    else:
        from eagle3_backend.verify.datasets import read_mtbench

        texts = [p.messages[-1][1] for p in read_mtbench()]
    texts = [texts[i % len(texts)] for i in range(req.probes)]
    if getattr(tok, "chat_template", None):
        texts = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                         add_generation_prompt=True) for t in texts]
    return [{"text": t} for t in texts]


def add_routes(app: Any, admin: _Admin) -> None:
    """GET /eagle3/draft and POST /eagle3/draft/swap, marked ADMIN_OPTIONAL like SGLang's
    /update_weights_from_disk (so --api-key / --admin-api-key protect them the same way)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    admin_optional = hooks.use(_AUTH_ENUM).ADMIN_OPTIONAL
    mark = hooks.use(_AUTH_LEVEL)(admin_optional)

    async def eagle3_draft_info(request):
        status, body = await admin.info()
        return JSONResponse(body, status_code=status)

    async def eagle3_draft_swap(request):
        try:
            body = await request.json()
        except ValueError:
            body = None
        status, out = await admin.swap(body)
        return JSONResponse(out, status_code=status)

    async def eagle3_draft_rollback(request):
        status, out = await admin.rollback()
        return JSONResponse(out, status_code=status)

    for fn in (eagle3_draft_info, eagle3_draft_swap, eagle3_draft_rollback):
        fn.__annotations__ = {"request": Request}  # resolved by FastAPI: no string annotation
        mark(fn)
    app.add_api_route(INFO_ROUTE, eagle3_draft_info, methods=["GET"])
    app.add_api_route(SWAP_ROUTE, eagle3_draft_swap, methods=["POST"])
    app.add_api_route(ROLLBACK_ROUTE, eagle3_draft_rollback, methods=["POST"])
    logger.info("eagle3_backend: added GET %s, POST %s and POST %s (admin routes)", INFO_ROUTE,
                SWAP_ROUTE, ROLLBACK_ROUTE)
