"""Draft weights on a live server (issue 17, first slice): the guard, the info route, swap checks.

Three things, through the ``draft`` and ``draft-http`` rows of ``hooks.HOOKS`` only:

* **The /update_weights_from_disk guard** (scheduler). Stock SGLang 0.5.23 loads the
  path it is given into the target *and then every draft runner*
  (``SchedulerWeightUpdaterManager.update_weights_from_disk`` over ``_select_runners("all")``);
  for an EAGLE-3 draft that means the target's checkpoint goes through the draft's
  ``load_weights`` (its layer 0, norm, lm_head names match the target's), which crashes the
  scheduler or silently corrupts the draft. With this plugin serving EAGLE-3 the call
  updates the target only and says so in its message; a path that is itself an EAGLE-3 draft
  checkpoint is refused before anything is read, naming ``/eagle3/draft/swap``.
* **GET /eagle3/draft** (admin route, SGLang's API-key rules): the active draft's path,
  layout, SHA-256 of its own weights as they are in memory now, load time, and acceptance
  since load counted from the scheduler's own ``update_spec_metrics`` calls.
* **POST /eagle3/draft/swap {"path": DIR}**: validation only. The start-up checks on the
  running target (``checks.check_launch``, the suite's words), then the same layout and every
  shape-affecting config field, else a refusal with the exact restart command. Weights are
  never touched: staging, commit and rollback are not built yet.

Which processes: the launcher verifies both groups after its pre-load checks and hands the
verdict to its schedulers in ``$EAGLE3_DRAFT_ADMIN`` (like the serving plan); a missing or
changed target turns this feature off with one log line and never stops the server. The
launcher registers the ``draft-http`` row at plugin load (main process only), the schedulers
of an EAGLE-3 launch the ``draft`` rows.
"""

from __future__ import annotations

import asyncio
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
from typing import Any, Callable, Iterable

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.serving import checks, hooks

logger = logging.getLogger(__name__)

#: Set by the launcher for its schedulers: "1" when every ``draft``/``draft-http`` row is present.
DRAFT_ENV = "EAGLE3_DRAFT_ADMIN"
INFO_ROUTE = "/eagle3/draft"
SWAP_ROUTE = "/eagle3/draft/swap"
FEATURE = f"the live-draft admin ({INFO_ROUTE}, {SWAP_ROUTE}, the /update_weights_from_disk guard)"

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

INFO_TIMEOUT = 120.0


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
    info_in: type
    info_out: type

    @property
    def all(self) -> tuple[type, ...]:
        return (self.info_in, self.info_out)


@functools.cache
def message_types() -> _Types:
    """The IPC messages (msgspec structs under SGLang's BaseReq; the tag is the class name)."""
    base = hooks.use(_BASE_REQ)

    class Eagle3DraftInfoReqInput(base, kw_only=True):
        pass

    class Eagle3DraftInfoReqOutput(base, kw_only=True):
        payload: str  # JSON: draft_info()

    types = _Types(Eagle3DraftInfoReqInput, Eagle3DraftInfoReqOutput)
    for cls in types.all:  # module-level names: SGLang's pickle IPC finds them by name
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls
    hooks.use(_CUSTOM_TYPES)(*types.all)  # and its msgpack IPC decodes them from now on
    return types


_TYPE_NAMES = ("Eagle3DraftInfoReqInput", "Eagle3DraftInfoReqOutput")


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
    verify_steps: int = 0
    accepted_tokens: int = 0
    correct_drafts: int = 0


_LOCK = threading.Lock()
_ACTIVE: list[DraftRecord] = []


def record_load(path: str, layout: str) -> None:
    """Called when the draft's weights were loaded (and checked): acceptance starts over."""
    with _LOCK:
        _ACTIVE[:] = [DraftRecord(path=str(path), layout=str(layout), loaded_at=time.time())]


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


def draft_tensors(scheduler: Any) -> list[tuple[str, Any]]:
    """The draft's own tensors: its parameters that are not the target's parameter objects
    (SGLang hands the draft the target's embed_tokens, and with load_lm_head_from_target its
    lm_head), and the token map it serves (``hot_token_id``, from d2t)."""
    target_ids = set()
    for _, runner in scheduler.tp_worker.weight_update_runners():
        target_ids |= {id(p) for p in runner.model.parameters()}
    runners = [r for role, r in scheduler.draft_worker.weight_update_runners() if role == "draft"]
    out = []
    for i, runner in enumerate(runners):
        prefix = f"{i}." if len(runners) > 1 else ""
        model = runner.model
        out += [(prefix + n, p) for n, p in model.named_parameters() if id(p) not in target_ids]
        hot = getattr(model, "hot_token_id", None)
        if hot is not None:
            out.append((prefix + "hot_token_id", hot))
    return out


def draft_info(scheduler: Any) -> dict[str, Any]:
    """GET /eagle3/draft's body, from this scheduler."""
    rec = active()
    if rec is None:
        return {"error": "eagle3_backend: this scheduler has not loaded its EAGLE-3 draft yet."}
    digest, count = weights_digest(draft_tensors(scheduler))
    with _LOCK:
        steps, accepted, correct = rec.verify_steps, rec.accepted_tokens, rec.correct_drafts
    return {
        "path": rec.path,
        "layout": rec.layout,
        "weights_sha256": digest,
        "weights_tensors": count,
        "loaded_at": rec.loaded_at,
        "acceptance": {
            "verify_steps": steps,
            "accepted_tokens": accepted,
            "correct_drafts": correct,
            "accept_length": round(accepted / steps, 6) if steps else None,
        },
    }


def after_init_request_dispatcher(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER Scheduler.init_request_dispatcher: answer this plugin's requests between batches."""
    types = message_types()
    dispatcher = hooks.use(_DISPATCHER)

    def handle(req: Any) -> Any:
        try:
            body = draft_info(scheduler)
        except Exception as exc:  # an info request must never stop the scheduler
            logger.exception("eagle3_backend: GET %s failed in the scheduler", INFO_ROUTE)
            body = {"error": f"eagle3_backend: reading the draft failed: {type(exc).__name__}: {exc}"}
        return types.info_out(payload=json.dumps(body))

    scheduler._request_dispatcher += dispatcher([(types.info_in, handle)])
    return None


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


def restart_command(argv: list[str] | None, draft: str) -> str:
    """The launch command with ``--speculative-draft-model-path`` set to ``draft``."""
    flag = "--speculative-draft-model-path"
    if not argv or not str(argv[0]).replace("\\", "/").endswith("sglang/launch_server.py"):
        return f"your launch command with {flag} {shlex.quote(draft)}"
    args, out, i, done = list(argv[1:]), [], 0, False
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
    return "python -m sglang.launch_server " + shlex.join(out)


@dataclass(frozen=True, slots=True)
class SwapVerdict:
    status: int  # HTTP status
    body: dict[str, Any]


def _refused(stage: str, message: str, status: int = 400, **extra: Any) -> SwapVerdict:
    return SwapVerdict(status, {"success": False, "stage": stage, "message": message, **extra})


def judge_swap(current: Any, launch: checks.LaunchArgs, target: Any, path: str,
               argv: list[str] | None) -> SwapVerdict:
    """Can the draft at ``path`` replace ``current`` (a ServingPlan) on this running target?

    Validation only: nothing is loaded into the server. A pass is answered 501 (the swap
    itself is not built yet), with the restart command that serves the new draft now.
    """
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
    return SwapVerdict(501, {
        "success": False, "stage": "not-implemented", "validated": True,
        "message": (f"eagle3_backend: draft {path} passes the start-up checks on this target and "
                    f"matches the served draft's layout {current.layout} and shape; swapping a live "
                    f"server's draft is not built yet, so nothing changed and {current.draft_path} "
                    f"still serves. To serve the new draft now, restart with: {cmd}"),
        "restart_command": cmd})


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
    """The launcher side of the routes: talks to the schedulers, runs the swap checks."""

    def __init__(self, server_args: Any, tokenizer_manager: Any, argv: list[str]):
        self.server_args, self.tm, self.argv = server_args, tokenizer_manager, argv
        self._comm: Any = None
        self._swap_lock = asyncio.Lock()

    def _communicator(self) -> Any:
        if self._comm is None:
            types = message_types()
            hooks.use(_TM_LOOP)(self.tm)  # the receive loop runs before the first generate, too
            fan_out = int(hooks.use(_GET_PARALLEL)().num_dp_ranks)
            self._comm = hooks.use(_COMMUNICATOR)(
                functools.partial(hooks.use(_TM_DISPATCH), self.tm), fan_out)
            self.tm._result_dispatcher += hooks.use(_DISPATCHER)([(types.info_out, self._comm.handle_recv)])
        return self._comm

    async def info(self) -> tuple[int, dict[str, Any]]:
        results = await asyncio.wait_for(self._communicator()(message_types().info_in()), INFO_TIMEOUT)
        bodies = [json.loads(r.payload) for r in results]
        body = bodies[0] if len(bodies) == 1 else {"dp_ranks": bodies}
        return (500 if any("error" in b for b in bodies) else 200), body

    async def swap(self, body: Any) -> tuple[int, dict[str, Any]]:
        path = body.get("path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            v = _refused("request", f'eagle3_backend: {SWAP_ROUTE} expects a JSON body {{"path": DIR}}; '
                                    f"got {str(body)[:200]}.")
            return v.status, v.body
        if self._swap_lock.locked():
            v = _refused("request", f"eagle3_backend: a draft swap is already running; {path} was "
                                    f"not considered. Retry when it has finished.", status=409)
            return v.status, v.body
        async with self._swap_lock:
            v = await asyncio.to_thread(self._judge, path)
        logger.info("eagle3_backend: %s %s: %s (%s)", SWAP_ROUTE, path, v.body["stage"], v.body["message"])
        return v.status, v.body

    def _judge(self, path: str) -> SwapVerdict:

        current = checks.process_plan()
        launch, target = checks.launch_args(self.server_args), checks.target_of(self.server_args)
        return judge_swap(current, launch, target, path, self.argv)


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

    for fn in (eagle3_draft_info, eagle3_draft_swap):
        fn.__annotations__ = {"request": Request}  # resolved by FastAPI: no string annotation
        mark(fn)
    app.add_api_route(INFO_ROUTE, eagle3_draft_info, methods=["GET"])
    app.add_api_route(SWAP_ROUTE, eagle3_draft_swap, methods=["POST"])
    logger.info("eagle3_backend: added GET %s and POST %s (admin routes)", INFO_ROUTE, SWAP_ROUTE)
