"""Every SGLang name this plugin touches, in one declarative table, checked before use.

The plugin runs on *stock* SGLang 0.5.23 through its out-of-tree hooks
(``sglang.srt.plugins.hook_registry.HookRegistry``). Each row of :data:`HOOKS`
is one SGLang target: a hook the plugin registers (BEFORE / AFTER / AROUND /
REPLACE, with the handler that implements it) or a name it calls or
subclasses (USE). The table is the only way in:

* :func:`register` registers exactly the hook rows, with their handlers;
* :func:`use` is the only function in ``eagle3_backend.serving`` that resolves
  an SGLang name, and only names that have a row;
* :func:`verify` resolves every row of a group and compares signatures.

So the table cannot drift from the code (``tests/serving/test_hooks.py`` also
checks that no other module imports sglang). When the installed SGLang lacks a
row, the plugin stops start-up with one line naming the SGLang version and the
missing target (:func:`fail_closed_line`) instead of running unpatched.

Groups: ``main`` rows are checked and registered in every process at plugin
load (cheap: the launcher has imported them already); ``serve`` rows only in
the processes of an EAGLE-3 launch (after the pre-load checks passed, see
``runtime.py``); ``arch:<Architecture>`` rows are the target model files,
checked for the served target only; ``cpu`` rows in every process of a launch on the CPU
engine with this package's platform (``eagle3_backend.cpu``), EAGLE-3 or not.

``draft`` and ``draft-http`` are the one *optional* feature, the live-draft admin
(``drafts.py``): the launcher of an EAGLE-3 launch verifies both after its checks and, when
a row is missing or changed, logs one line and turns only that feature off (never the
server); ``draft-http`` is registered in the main process, ``draft`` in the schedulers of an
EAGLE-3 launch with the feature on.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from eagle3_backend.plan import ARCHS

logger = logging.getLogger(__name__)

SUPPORTED_SGLANG = "0.5.23"
PLUGIN_NAME = "eagle3"

BEFORE, AFTER, AROUND, REPLACE, USE = "before", "after", "around", "replace", "use"
_KINDS = (BEFORE, AFTER, AROUND, REPLACE, USE)
CLASS = "class"  # signature of a class target (REPLACE of a class, or a base class)
#: ``draft`` and ``draft-http`` are one optional feature (serving/drafts.py): a missing row
#: turns it off with one line; every other group stops start-up instead.
GROUPS = ("main", "serve", "cpu", "draft", "draft-http")


@dataclass(frozen=True, slots=True)
class Hook:
    """One SGLang target: dotted path, how it is used, its expected signature."""

    target: str
    kind: str
    signature: str  # normalized, see signature_of(); CLASS for classes
    group: str  # "main", "serve", "cpu" or "arch:<HF architecture>"
    handler: str = ""  # "module:function" returning the hook callable (hook rows only)
    why: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"hook kind {self.kind!r} not in {_KINDS}")
        if (self.kind == USE) == bool(self.handler):
            raise ValueError(f"{self.target}: a {self.kind} row {'must' if self.kind != USE else 'cannot'} name a handler")
        if not (self.group in GROUPS or self.group.startswith("arch:")):
            raise ValueError(f"{self.target}: unknown group {self.group!r}")


_S = "eagle3_backend.serving"
_AUX = "sglang.srt.layers.aux_hidden_states"
_CONFIGURE = "sglang.srt.model_executor.model_runner_components.attention_backend_setup.configure_aux_hidden_state_capture"
_SET = "(self, layer_ids=)"
_HTTP = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_WU = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_MR = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter"

HOOKS: tuple[Hook, ...] = (
    # -- launcher: refusals before any weight is loaded ---------------------------------
    Hook("sglang.srt.server_args.ServerArgs.check_server_args", AFTER, "(self)", "main",
         f"{_S}.runtime:after_check_server_args",
         "runs once in the launcher after argument resolution, before any process loads weights"),
    Hook("sglang.srt.arg_groups.speculative_hook._resolve_speculative_algorithm_alias", BEFORE,
         "(speculative_algorithm, speculative_draft_model_path, trust_remote_code=, kwargs=)", "main",
         f"{_S}.runtime:before_resolve_speculative_algorithm",
         "SGLang reads the draft's config while it resolves the arguments, before "
         "check_server_args: a draft path that is not there ended in a hub traceback"),
    Hook("sglang.srt.arg_groups.model_override_base.resolving_view", USE, "(server_args)", "main",
         why="the resolved arguments (algorithm, paths, parallelism)"),
    Hook("sglang.srt.arg_groups.model_override_base.model_config_of", USE, "(server_args)", "main",
         why="SGLang's own view of the target config (hub ids and overrides included)"),
    Hook("sglang.srt.plugins.hook_registry.HookRegistry.register", USE,
         "(target, hook, hook_type=, *, source=)", "main", why="registering this table's hook rows"),
    Hook("sglang.srt.plugins.hook_registry.HookType", USE, CLASS, "main", why="hook kinds"),
    # -- launcher: requests that would stop the scheduler get a 400 ----------------------
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", BEFORE,
         "(self, obj, input_ids)", "main", f"{_S}.requests:before_validate_one_request",
         "an empty prompt, an out-of-vocabulary token id or top_logprobs_num above the vocabulary "
         "raises in the scheduler and stops the server"),
    # -- scheduler: a request reaching the KV pool ends with "length", not a 500 ----------
    Hook("sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens", AFTER, "(self, req)",
         "serve", f"{_S}.requests:after_init_req_max_new_tokens",
         "SGLang clips max_new_tokens for one decode token a step; an EAGLE-3 step reserves "
         "more, so a request reaching the pool was aborted with HTTP 500 and no output"),
    Hook("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode", USE, "()", "serve",
         why="the KV slots one request reserves past its committed length each decode step"),
    Hook("sglang.srt.managers.schedule_batch.Req.set_finish_with_abort", USE,
         "(self, error_msg, status_code=, err_type=)", "serve",
         why="a prompt that leaves no room for one decode step gets a 400 naming why, as SGLang's "
             "own prompt-exceeds-the-KV-budget does (not an empty answer)"),
    # -- scheduler: layout-exact capture --------------------------------------------------
    Hook(_CONFIGURE, AROUND,
         "(*, model, eagle_use_aux_hidden_state, eagle_aux_hidden_state_layer_ids, "
         "dflash_use_aux_hidden_state, dflash_target_layer_ids, is_dspark)", "serve",
         f"{_S}.runtime:around_configure_capture",
         "the one call that tells the target which layers to capture (before CUDA graph capture)"),
    Hook(f"{_AUX}.AuxHiddenStateList", REPLACE, CLASS, "serve", f"{_S}.collect:aux_list_class",
         "list collector of llama/qwen/glm4_moe/gpt-oss/qwen3_moe: captures go to their layout slot"),
    Hook(f"{_AUX}.AuxHiddenStateList.capture", USE, "(self, hidden, *, owned=)", "serve",
         why="overridden by LayoutAuxList"),
    Hook(f"{_AUX}.AuxHiddenStatePacker", REPLACE, CLASS, "serve", f"{_S}.collect:aux_packer_class",
         "packing collector of deepseek_v2 (Kimi-K2, DeepSeek-V3): slots follow the layout"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.__init__", USE, "(self, num_captures, out=)", "serve",
         why="overridden by LayoutAuxPacker"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.slot", USE, "(self, like)", "serve", why="overridden"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.append", USE, "(self, hidden)", "serve", why="overridden"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.extend", USE, "(self, hiddens)", "serve", why="overridden"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.capture", USE, "(self, hidden, *, owned=)", "serve",
         why="overridden"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.finalize", USE, "(self)", "serve", why="overridden"),
    Hook(f"{_AUX}.AuxHiddenStatePacker.for_batch", USE, "(forward_batch, num_captures)", "serve",
         why="builds through __init__ (overridden)"),
    Hook("sglang.srt.layers.logits_processor.LogitsProcessor.forward", BEFORE,
         "(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=, "
         "hidden_states_before_norm=)", "serve", f"{_S}.runtime:before_logits_forward",
         "hands the packed [T, K*H] fc input on; runs the warm-up self-check"),
    Hook("sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3.load_weights", AROUND,
         "(self, weights)", "serve", f"{_S}.runtime:around_draft_load_weights",
         "refuses a draft tensor SGLang's loader skips (it would serve random weights)"),
    Hook("sglang.srt.model_loader.weight_utils.default_weight_loader", USE,
         "(param, loaded_weight)", "serve", why="the loader of draft params without their own"),
    Hook("sglang.srt.runtime_context.get_spec", USE, "()", "serve",
         why="the scheduler's speculative arguments (algorithm, draft path)"),
    # -- target model files: the capture id rule of each (model_ids() relies on it) -------
    *(
        Hook(f"{cls}.set_eagle3_layers_to_capture", USE, _SET, f"arch:{arch}",
             why="this file's id rule is what ServingPlan.model_ids() inverts")
        for arch, cls in ((a.architecture, a.model_class) for a in ARCHS.values())
    ),
    # -- CPU engine (eagle3_backend.cpu platform active), every launch ---------------------
    Hook("sglang.srt.distributed.parallel_state.init_model_parallel_group", BEFORE,
         "(group_ranks, local_rank, backend, use_pynccl=, use_custom_allreduce=, "
         "use_message_queue_broadcaster=, group_name=, use_mscclpp=, "
         "use_torch_symm_mem_allreduce=, recovered_rank=, rank_offset=, max_world_size=)", "cpu",
         "eagle3_backend.cpu.platform:before_init_model_parallel_group",
         "SGLang's in-tree CPU platform defaults every model-parallel group to a PyNccl "
         "communicator, which is CUDA-only: --tp-size 2 on CPU died at process-group set-up"),
    Hook("sglang.srt.models.qwen2_moe.Qwen2MoeModel.set_eagle3_layers_to_capture", USE,
         "(self, layers_to_capture)", "arch:Qwen3MoeForCausalLM",
         why="qwen3_moe hands the shifted ids on to the inner model"),
    # -- live-draft admin (drafts.py): off with one line when any row is missing -----------
    # launcher (main process): the admin routes and their round trip to the schedulers
    Hook(_HTTP, BEFORE, "(server_args, tokenizer_manager, template_manager, port_args, "
         "scheduler_infos, subprocess_watchdog, execute_warmup_func=, launch_callback=)",
         "draft-http", f"{_S}.drafts:before_setup_http_server",
         "runs once before uvicorn starts and before SGLang adds its API-key middleware: "
         "routes added here follow SGLang's key rules"),
    Hook("sglang.srt.entrypoints.http_server.app", USE, "(scope, receive, send)", "draft-http",
         why="SGLang's FastAPI app, where GET /eagle3/draft and POST /eagle3/draft/swap go"),
    Hook("sglang.srt.utils.auth.auth_level", USE, "(level)", "draft-http",
         why="marks the routes ADMIN_OPTIONAL, like /update_weights_from_disk"),
    Hook("sglang.srt.utils.auth.AuthLevel", USE, CLASS, "draft-http", why="auth levels"),
    Hook("sglang.srt.managers.communicator.FanOutCommunicator", USE, CLASS, "draft-http",
         why="one request to every DP scheduler, one answer each (SGLang's control-plane pattern)"),
    Hook(f"{_TM}._dispatch_to_scheduler", USE, "(self, obj)", "draft-http",
         why="sends the info request to the schedulers"),
    Hook(f"{_TM}.auto_create_handle_loop", USE, "(self)", "draft-http",
         why="the tokenizer manager's receive loop, which routes answers through its "
             "_result_dispatcher (an instance attribute, extended with this plugin's type)"),
    Hook("sglang.srt.runtime_context.get_parallel", USE, "()", "draft-http",
         why="num_dp_ranks: how many answers one draft request gets; in the schedulers, the "
             "TP group whose ranks agree on every staging and commit"),
    Hook("sglang.srt.managers.io_struct.GenerateReqInput", USE, CLASS, "draft-http",
         why="the swap's canary probes (greedy, through the server's own tokenizer manager)"),
    Hook(f"{_TM}.generate_request", USE, "(self, obj, request=)", "draft-http",
         why="sends a canary probe like /generate does"),
    # both sides: this plugin's IPC message types
    Hook("sglang.srt.managers.io_struct.BaseReq", USE, CLASS, "draft",
         why="base of the info request/answer structs (msgspec, tagged by class name)"),
    Hook("sglang.srt.managers.io_struct.hook_custom_types", USE, "(*new_types)", "draft",
         why="registers those structs with the IPC decoder of each process"),
    Hook("sglang.utils.TypeBasedDispatcher", USE, CLASS, "draft",
         why="extends the scheduler's _request_dispatcher and the tokenizer's _result_dispatcher"),
    # scheduler: info handler, acceptance since load, the /update_weights_from_disk guard
    Hook("sglang.srt.managers.scheduler.Scheduler.init_request_dispatcher", AFTER, "(self)", "draft",
         f"{_S}.swap:after_init_request_dispatcher",
         "adds the info request to the scheduler's dispatcher (answered between batches)"),
    Hook(f"{_MR}.update_spec_metrics", AFTER,
         "(self, bs, num_correct_drafts, num_accept_tokens, num_block_accept_tokens=, num_cap_tokens=)",
         "draft", f"{_S}.drafts:after_update_spec_metrics",
         "the scheduler's own per-batch acceptance counts, summed since the draft was loaded"),
    Hook(f"{_WU}.update_weights_from_disk", AROUND, "(self, recv_req)", "draft",
         f"{_S}.drafts:around_update_weights_from_disk",
         "stock 0.5.23 loads the given (target) path into the target and then every draft "
         "runner: a crash or a silently corrupted EAGLE-3 draft; here the target only"),
    Hook(f"{_WU}._select_runners", AROUND, "(self, selector=)", "draft",
         f"{_S}.drafts:around_select_runners",
         "the (role, runner) pairs an update applies to; the guard drops the draft roles"),
    Hook("sglang.srt.managers.io_struct.UpdateWeightFromDiskReqOutput", USE, CLASS, "draft",
         why="the answer to a refused /update_weights_from_disk of a draft checkpoint"),
    Hook("sglang.srt.speculative.base_spec_worker.BaseSpecWorker.weight_update_runners", USE,
         "(self)", "draft", why="the draft's runners (role 'draft'), whose weights are hashed"),
    Hook("sglang.srt.managers.tp_worker.TpModelWorker.weight_update_runners", USE, "(self)", "draft",
         why="the target's runner: its parameter objects the draft shares are not the draft's"),
    Hook("sglang.srt.managers.scheduler.Scheduler.is_fully_idle", USE,
         "(self, for_health_check=, ignore_waiting=)", "draft",
         why="a committed swap flushes the prefix cache only when nothing runs"),
    Hook("sglang.srt.managers.scheduler.Scheduler.flush_cache", USE, "(self, empty_cache=)", "draft",
         why="drops the prefix cache whose draft KV the old draft wrote"),
)

_BY_TARGET: dict[str, Hook] = {h.target: h for h in HOOKS}
assert len(_BY_TARGET) == len(HOOKS), "duplicate target in HOOKS"


def rows(group: str) -> list[Hook]:
    """The rows of one group (``"all"``: every row)."""
    return [h for h in HOOKS if group == "all" or h.group == group]


def arch_group(architecture: str) -> str:
    return f"arch:{architecture}"


def verify_arch(architecture: str) -> list[str]:
    """:func:`verify` for a served target's model file, and the file it wraps (whose setter
    and id rule it uses); [] for an architecture the plan refuses anyway."""
    arch = ARCHS.get(architecture)
    wrapped = [arch.wraps] if arch is not None and arch.wraps else []
    return [p for a in (architecture, *wrapped) for p in verify(arch_group(a))]


# ---------------------------------------------------------------------------- resolving
def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # not installed as a distribution
        mod = importlib.import_module("sglang")
        return str(getattr(mod, "__version__", "unknown"))


def _resolve(target: str) -> Any:
    return pkgutil.resolve_name(target)


def use(target: str) -> Any:
    """Resolve an SGLang name that has a row in :data:`HOOKS` (and only such a name)."""
    if target not in _BY_TARGET:
        raise KeyError(f"{target} has no row in eagle3_backend.serving.hooks.HOOKS; add one")
    return _resolve(target)


def signature_of(obj: Any) -> str:
    """Parameter names and kinds only: ``(self, x, y=, *, z, **kw)``; CLASS for a class."""
    if inspect.isclass(obj):
        return CLASS
    sig = inspect.signature(obj)
    parts: list[str] = []
    star_done = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star_done = True
            continue
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
            continue
        parts.append(p.name + ("=" if p.default is not p.empty else ""))
    return "(" + ", ".join(parts) + ")"


def param_index(target: str, name: str) -> int:
    """Position of parameter ``name`` in a row's expected signature (for BEFORE hooks)."""
    names = [p.strip().rstrip("=") for p in _BY_TARGET[target].signature.strip("()").split(",")]
    return names.index(name)


def _problem(row: Hook) -> str | None:
    try:
        obj = _resolve(row.target)
    except Exception as exc:  # ImportError, AttributeError, anything a module raises on import
        return f"lacks hook target {row.target} ({type(exc).__name__}: {exc})"
    try:
        found = signature_of(obj)
    except (TypeError, ValueError):
        found = "<no signature>"
    if found != row.signature:
        return f"has hook target {row.target} with signature {found}, expected {row.signature}"
    return None


def verify(group: str) -> list[str]:
    """Problems with the installed SGLang for the rows of ``group`` (empty: all present)."""
    return [p for p in (_problem(r) for r in rows(group)) if p is not None]


def fail_closed_line(problem: str) -> str:
    """The one line start-up stops with when a hook target is missing or changed."""
    return (
        f"eagle3_backend: SGLang {sglang_version()} {problem}; this plugin is built for "
        f"SGLang {SUPPORTED_SGLANG} and will not run unpatched. Install sglang=={SUPPORTED_SGLANG}, "
        f"or exclude the plugin with SGLANG_PLUGINS=<the plugins you want, without "
        f"'{PLUGIN_NAME}'> to run stock SGLang."
    )


# ---------------------------------------------------------------------------- registering
def _handler(row: Hook) -> Callable[..., Any] | type:
    module, _, factory = row.handler.partition(":")
    return getattr(importlib.import_module(module), factory)


@functools.cache
def hook_object(target: str) -> Callable[..., Any] | type:
    """What is registered for a hook row: the handler function, or the class its factory builds."""
    row = _BY_TARGET[target]
    handler = _handler(row)
    return handler() if row.kind == REPLACE else handler


def register(group: str) -> list[str]:
    """Register every hook row of ``group`` with SGLang's HookRegistry; returns their targets."""
    registry = use("sglang.srt.plugins.hook_registry.HookRegistry.register")
    hook_type = use("sglang.srt.plugins.hook_registry.HookType")
    done = []
    for row in rows(group):
        if row.kind == USE:
            continue
        registry(row.target, hook_object(row.target), hook_type(row.kind))
        done.append(row.target)
    return done
