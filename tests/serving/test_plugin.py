"""Installed means active: SGLang's own plugin loader finds the entry point, SGLANG_PLUGINS
excludes it, and load_plugins() in a fresh process applies exactly the table's hooks.

(Which rows a process registers with and without an EAGLE-3 plan is also checked in
process, with a recording registry: tests/serving/test_hooks.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from serving_launch import PYTHON, REPO, declared_entry_points, subprocess_env

pytestmark = pytest.mark.sglang

GROUP = "sglang.srt.plugins"


@pytest.fixture
def on_path(plugin_site, monkeypatch):
    pytest.importorskip("sglang")
    monkeypatch.syspath_prepend(str(plugin_site))
    return plugin_site


def test_pyproject_declares_the_plugin():
    assert declared_entry_points()[GROUP] == {"eagle3": "eagle3_backend.serving:plugin"}


def test_sglang_discovers_the_plugin(on_path, monkeypatch):
    from sglang.srt.plugins import load_plugins_by_group

    from eagle3_backend.serving import plugin

    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    found = load_plugins_by_group(GROUP)
    assert found["eagle3"][0] is plugin
    assert found["eagle3"][1] == "eagle3-backend"


def test_sglang_plugins_can_exclude_it(on_path, monkeypatch):
    from sglang.srt.plugins import load_plugins_by_group

    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    assert "eagle3" not in load_plugins_by_group(GROUP)
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin,eagle3")
    assert "eagle3" in load_plugins_by_group(GROUP)


_PROBE = textwrap.dedent("""
    import json, sys
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()
    import sglang.srt.layers.aux_hidden_states as aux
    import sglang.srt.models.llama as llama          # imported after the hooks were applied
    import sglang.srt.models.deepseek_v2 as dsv2
    from sglang.srt.server_args import ServerArgs
    ours = sorted(t for t, hs in HookRegistry._hooks.items()
                  if any(src is not None and src.plugin_name == "eagle3" for _, _, src in hs))
    print("PROBE " + json.dumps({
        "ours": ours, "applied": all(t in HookRegistry._patched for t in ours),
        "list": aux.AuxHiddenStateList.__name__, "llama_list": llama.AuxHiddenStateList.__name__,
        "packer": dsv2.AuxHiddenStatePacker.__name__,
        "check_wrapped": hasattr(ServerArgs.check_server_args, "__wrapped__"),
    }))
""")


def _probe(plugin_site, **env) -> dict:
    proc = subprocess.run([PYTHON, "-c", _PROBE], env=subprocess_env(plugin_site, **env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])


@pytest.mark.slow
def test_load_plugins_applies_the_table_in_an_eagle3_process(plugin_site):
    """A scheduler of an EAGLE-3 launch ($EAGLE3_SERVING_PLAN set by the launcher's checks)."""
    pytest.importorskip("sglang")
    from eagle3_backend.serving import checks, hooks
    from eagle3_backend.plan import ServingPlan

    plan = ServingPlan(layout="[embed, layer_input:2]", architecture="LlamaForCausalLM",
                       num_layers=4, hidden_size=8, draft_path="d", layout_source="explicit")
    got = _probe(plugin_site, **{checks.PLAN_ENV: plan.to_json()})
    # a main process (this probe) also gets the live-draft route hook; the schedulers' draft
    # rows are registered in child processes only (their registration: test_hooks.py, and the
    # server tier tests/cpu/test_cpu_draft_admin.py)
    expected = sorted(h.target for h in hooks.HOOKS
                      if h.kind != hooks.USE and h.group in ("main", "serve", "draft-http"))
    assert got["ours"] == expected and got["applied"]
    assert got["list"] == got["llama_list"] == "LayoutAuxList"
    assert got["packer"] == "LayoutAuxPacker"
    assert got["check_wrapped"] is True


def test_importing_the_package_never_imports_sglang():
    code = "import sys, eagle3_backend, eagle3_backend.serving; print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=subprocess_env(REPO))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
