"""The hook table: every row exists in the installed SGLang, the code uses nothing else,
and a missing row stops start-up with one line naming the version and the target."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from eagle3_backend import plan as capture
from eagle3_backend.serving import hooks

SERVING = Path(hooks.__file__).parent

pytestmark = pytest.mark.sglang


@pytest.fixture(autouse=True)
def _sglang():
    pytest.importorskip("sglang")


def test_every_row_exists_in_the_installed_sglang():
    assert hooks.sglang_version() == hooks.SUPPORTED_SGLANG
    assert hooks.verify("all") == []


def test_signature_normalization():
    def f(self, a, b=1, *, c, d=2, **kw):
        pass

    def g(*args, x=None):
        pass

    assert hooks.signature_of(f) == "(self, a, b=, *, c, d=, **kw)"
    assert hooks.signature_of(g) == "(*args, x=)"
    assert hooks.signature_of(int) == hooks.CLASS


def _sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(SERVING.glob("*.py"))}


def test_only_the_table_resolves_sglang_names():
    """No module of eagle3_backend.serving imports sglang; hooks.use() is the only way in."""
    for name, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "sglang" for a in node.names), name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "sglang", (name, node.module)


def test_every_use_in_the_code_has_a_row_and_every_row_is_used():
    used: set[str] = set()
    for text in _sources().values():
        used |= set(re.findall(r'hooks\.use\(\s*"([^"]+)"', text))
        used |= set(re.findall(r'\buse\(\s*"([^"]+)"', text))
    # module-level constants passed to use() in collect.py / runtime.py
    used |= {m for name, text in _sources().items() if name != "hooks.py"
             for m in re.findall(r'^[A-Z_]+ = "(sglang\.[^"]+)"', text, re.M)}
    rows = {h.target for h in hooks.HOOKS}
    assert used <= rows, used - rows
    hook_rows = {h.target for h in hooks.HOOKS if h.kind != hooks.USE}
    arch_rows = {h.target for h in hooks.HOOKS if h.group.startswith("arch:")}
    overridden = {h.target for h in hooks.HOOKS if h.why.startswith(("overridden", "builds through"))}
    # every USE row is either called through use(), a method a REPLACE subclass overrides,
    # or a model file's capture rule that ServingPlan.model_ids() inverts
    assert rows - hook_rows - arch_rows - overridden <= used, rows - hook_rows - arch_rows - overridden - used
    assert arch_rows == {f"{a.model_class}.set_eagle3_layers_to_capture" for a in capture.ARCHS.values()} | {
        "sglang.srt.models.qwen2_moe.Qwen2MoeModel.set_eagle3_layers_to_capture"}
    assert {h.group for h in hooks.HOOKS if h.group.startswith("arch:")} == {
        hooks.arch_group(a) for a in capture.ARCHS}


def test_overridden_methods_are_the_ones_the_subclasses_define():
    from eagle3_backend.serving import collect

    classes = {"AuxHiddenStateList": collect.aux_list_class(), "AuxHiddenStatePacker": collect.aux_packer_class()}
    for h in hooks.HOOKS:
        if h.why == "overridden" or h.why.startswith("overridden by"):
            owner, method = h.target.rsplit(".", 2)[-2:]
            assert method in vars(classes[owner]), h.target


def test_hook_handlers_resolve_and_match_their_kind():
    for h in hooks.HOOKS:
        if h.kind == hooks.USE:
            continue
        obj = hooks.hook_object(h.target)
        assert isinstance(obj, type) == (h.kind == hooks.REPLACE), h.target
        if h.kind == hooks.REPLACE:
            assert issubclass(obj, hooks.use(h.target))


def test_missing_target_fails_closed_with_one_line(monkeypatch):
    from eagle3_backend.serving import plugin

    real = hooks._resolve

    def resolve(target):
        if target == "sglang.srt.server_args.ServerArgs.check_server_args":
            raise AttributeError("type object 'ServerArgs' has no attribute 'check_server_args'")
        return real(target)

    monkeypatch.setattr(hooks, "_resolve", resolve)
    registered = []
    monkeypatch.setattr(hooks, "register", lambda group: registered.append(group) or [])
    with pytest.raises(SystemExit) as stop:
        plugin()
    line = str(stop.value)
    assert "\n" not in line
    assert line.startswith("eagle3_backend: SGLang 0.5.23 lacks hook target "
                           "sglang.srt.server_args.ServerArgs.check_server_args")
    assert "SGLANG_PLUGINS" in line and "sglang==0.5.23" in line
    assert registered == []  # nothing registered: no half-patched SGLang


def test_changed_signature_fails_closed(monkeypatch):
    row = hooks.Hook("sglang.srt.layers.logits_processor.LogitsProcessor.forward", hooks.USE,
                     "(self, input_ids)", "main")
    monkeypatch.setattr(hooks, "HOOKS", (row,))
    monkeypatch.setattr(hooks, "_BY_TARGET", {row.target: row})
    (problem,) = hooks.verify("main")
    assert problem.startswith("has hook target sglang.srt.layers.logits_processor.LogitsProcessor.forward "
                              "with signature (self, input_ids, hidden_states, lm_head")
    assert problem.endswith("expected (self, input_ids)")


def test_a_wrapping_target_checks_the_setter_it_calls(monkeypatch):
    """Kimi-K2.5's file calls DeepseekV3ForCausalLM's setter, whose id rule the plan inverts:
    a change there stops a Kimi-K2.5 launch too, not only a DeepSeek-V3 one."""
    setter = "sglang.srt.models.deepseek_v2.DeepseekV3ForCausalLM.set_eagle3_layers_to_capture"
    assert hooks.verify_arch("KimiK25ForConditionalGeneration") == []
    real = hooks._resolve

    def resolve(target):
        if target == setter:
            raise AttributeError("no attribute 'set_eagle3_layers_to_capture'")
        return real(target)

    monkeypatch.setattr(hooks, "_resolve", resolve)
    for arch in ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"):
        (problem,) = hooks.verify_arch(arch)
        assert problem.startswith(f"lacks hook target {setter}"), problem
    assert hooks.verify_arch("LlamaForCausalLM") == []
    assert hooks.verify_arch("Gemma2ForCausalLM") == []  # refused by the plan, not here


def _recording_registry(monkeypatch, missing: str | None = None) -> list[str]:
    """Targets registered from now on (SGLang's registry is not touched); ``missing`` resolves to nothing."""
    calls: list[str] = []
    real = hooks._resolve

    def resolve(target):
        if target == missing:
            raise AttributeError(f"no attribute {target.rsplit('.', 1)[-1]!r}")
        if target == "sglang.srt.plugins.hook_registry.HookRegistry.register":
            return lambda target, hook, hook_type=None, *, source=None: calls.append(target)
        return real(target)

    monkeypatch.setattr(hooks, "_resolve", resolve)
    return calls


def test_cpu_rows_are_registered_on_the_cpu_engine_only(monkeypatch):
    from eagle3_backend.serving import checks, plugin

    calls = _recording_registry(monkeypatch)
    monkeypatch.delenv(checks.PLAN_ENV, raising=False)
    cpu = [h.target for h in hooks.rows("cpu")]
    assert cpu == ["sglang.srt.distributed.parallel_state.init_model_parallel_group"]
    for engine, platform, expected in (("1", "1", cpu), ("1", "0", []), ("0", "1", [])):
        monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", engine)
        monkeypatch.setenv("EAGLE3_CPU_PLATFORM", platform)
        calls.clear()
        plugin()
        assert [c for c in calls if c in cpu] == expected, (engine, platform, calls)


def test_cpu_groups_get_no_pynccl_unless_asked():
    from eagle3_backend.cpu.platform import before_init_model_parallel_group as hook

    # SGLang's own calls: positional ranks/rank/backend, use_pynccl by keyword or defaulted
    assert hook([[0, 1]], 0, "gloo") == (([[0, 1]], 0, "gloo"), {"use_pynccl": False})
    assert hook([[0, 1]], 0, "gloo", use_pynccl=None, group_name="tp") == (
        ([[0, 1]], 0, "gloo"), {"use_pynccl": False, "group_name": "tp"})
    assert hook([[0, 1]], 0, "gloo", None, True) == (([[0, 1]], 0, "gloo", False, True), {})
    # an explicit choice is the caller's
    assert hook([[0, 1]], 0, "gloo", use_pynccl=True) == (([[0, 1]], 0, "gloo"), {"use_pynccl": True})
    assert hook([[0, 1]], 0, "gloo", False) == (([[0, 1]], 0, "gloo", False), {})


def test_plugin_registers_serve_rows_only_in_an_eagle3_launch(monkeypatch):
    from eagle3_backend.serving import checks, plugin, runtime
    from eagle3_backend.plan import ServingPlan

    calls: list[tuple[str, str]] = []
    real = hooks._resolve

    def fake_register(target, hook, hook_type=None, *, source=None):  # HookRegistry.register's shape
        calls.append((target, hook_type.value))

    def resolve(target):
        if target == "sglang.srt.plugins.hook_registry.HookRegistry.register":
            return fake_register
        return real(target)

    monkeypatch.setattr(hooks, "_resolve", resolve)
    monkeypatch.delenv(checks.PLAN_ENV, raising=False)
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    plugin()
    # the main process (this one: the launcher) also gets the live-draft route hook
    http = [(h.target, h.kind) for h in hooks.rows("draft-http") if h.kind != hooks.USE]
    assert http == [("sglang.srt.entrypoints.http_server._setup_and_run_http_server", "before")]
    assert calls == [("sglang.srt.server_args.ServerArgs.check_server_args", "after"),
                     ("sglang.srt.arg_groups.speculative_hook._resolve_speculative_algorithm_alias",
                      "before"),
                     ("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "before"),
                     *http]
    calls.clear()
    plan = ServingPlan(layout="[embed, layer_input:2]", architecture="LlamaForCausalLM", num_layers=4,
                       hidden_size=8, draft_path="d", layout_source="explicit")
    monkeypatch.setenv(checks.PLAN_ENV, plan.to_json())
    runtime.process_plan.cache_clear()
    try:
        plugin()
    finally:
        runtime.process_plan.cache_clear()
    assert calls == [(h.target, h.kind) for h in hooks.HOOKS
                     if h.kind != hooks.USE and h.group in ("main", "serve", "draft-http")]


def _child_process(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())


def _in_eagle3_scheduler(monkeypatch) -> None:
    """This process as a scheduler of a checked EAGLE-3 launch (not on the CPU engine)."""
    from eagle3_backend.serving import checks
    from eagle3_backend.plan import ServingPlan

    _child_process(monkeypatch)
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    plan = ServingPlan(layout="[embed, layer_input:2]", architecture="LlamaForCausalLM", num_layers=4,
                       hidden_size=8, draft_path="d", layout_source="explicit")
    monkeypatch.setenv(checks.PLAN_ENV, plan.to_json())


def test_a_scheduler_registers_the_draft_rows_when_the_launcher_turned_them_on(monkeypatch):
    from eagle3_backend.serving import drafts, plugin, runtime

    calls = _recording_registry(monkeypatch)
    _in_eagle3_scheduler(monkeypatch)
    draft_rows = [h.target for h in hooks.rows("draft") if h.kind != hooks.USE]
    assert draft_rows == ["sglang.srt.managers.scheduler.Scheduler.init_request_dispatcher",
                          f"{hooks._MR}.update_spec_metrics", f"{hooks._WU}.update_weights_from_disk",
                          f"{hooks._WU}._select_runners"]
    runtime.process_plan.cache_clear()
    try:
        for env, expected in ((None, []), ("1", draft_rows)):
            if env is None:
                monkeypatch.delenv(drafts.DRAFT_ENV, raising=False)
            else:
                monkeypatch.setenv(drafts.DRAFT_ENV, env)
            calls.clear()
            plugin()
            assert [c for c in calls if c in draft_rows] == expected, env
            assert hooks._HTTP not in calls  # a child process never hooks the HTTP server
    finally:
        runtime.process_plan.cache_clear()


def test_a_missing_draft_row_turns_off_only_that_feature_with_one_line(monkeypatch, caplog):
    """The launcher logs one line and keeps going; a scheduler told 'on' but missing a row
    registers nothing of the feature and still starts."""
    import os

    from eagle3_backend.serving import drafts, plugin, runtime

    gone = f"{hooks._WU}._select_runners"
    calls = _recording_registry(monkeypatch, missing=gone)
    monkeypatch.setenv(drafts.DRAFT_ENV, "1")
    caplog.set_level("WARNING", logger="eagle3_backend")
    assert drafts.decide_in_launcher() is False
    assert drafts.DRAFT_ENV not in os.environ
    (line,) = [r.getMessage() for r in caplog.records if "live-draft admin" in r.getMessage()]
    assert "\n" not in line
    assert line.startswith(f"eagle3_backend: SGLang 0.5.23 lacks hook target {gone} (AttributeError")
    assert "is off on this server" in line and "EAGLE-3 serving is unaffected" in line

    _in_eagle3_scheduler(monkeypatch)
    monkeypatch.setenv(drafts.DRAFT_ENV, "1")
    runtime.process_plan.cache_clear()
    try:
        plugin()  # no SystemExit
    finally:
        runtime.process_plan.cache_clear()
    assert not {h.target for h in hooks.rows("draft")} & set(calls)
    assert "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens" in calls  # serving is on
