"""The CPU platform plugin as SGLang sees it: discovery, the sgl_kernel stand-in, AMX fact, defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, plugin_site: Path, timeout: float = 300, **env_extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EAGLE3_", "SGLANG_", "GOMP_", "OMP_WAIT"))}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_site), str(REPO)])
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_point_is_import_light_and_inert_without_cpu_engine(plugin_site):
    out = _run("""
        import json, sys
        from eagle3_backend.cpu import entry
        light = not any(m in sys.modules for m in ("sglang", "torch"))
        print(json.dumps({"light": light, "result": entry.activate(),
                          "stand_in": "sgl_kernel" in sys.modules}))
    """, plugin_site)
    assert out == {"light": True, "result": None, "stand_in": False}


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_resolves_platform_stand_in_and_defaults(plugin_site, smollm2_dir):
    out = _run(f"""
        import json
        from sglang.srt.platforms import current_platform
        from sglang.srt.runtime_context import get_platform
        from sglang.srt.utils.common import cpu_has_amx_support
        import sgl_kernel, torch
        res = {{"platform": type(current_platform).__name__, "is_cpu": current_platform.is_cpu(),
               "has_amx": get_platform().has_amx, "layers_amx": cpu_has_amx_support(),
               "same_op": sgl_kernel.decode_attention_cpu is torch.ops.sgl_kernel.decode_attention_cpu,
               "gomp": __import__("os").environ.get("GOMP_SPINCOUNT")}}
        try:
            from sgl_kernel import fused_experts_cpu
        except ImportError as e:
            res["from_import"] = str(e)
        try:
            sgl_kernel.fused_experts_cpu
        except AttributeError as e:
            res["attr"] = str(e)
        try:
            import sgl_kernel.kvcacheio
        except ImportError as e:
            res["submodule"] = str(e)
        from sglang.srt.server_args import prepare_server_args
        sa = prepare_server_args(["--model-path", {str(smollm2_dir)!r}, "--device", "cpu"])
        sa.resolve_once()
        from sglang.srt.arg_groups.overrides import resolution_result
        res["attention_backend"] = resolution_result(sa, "attention_backend")
        res["sleep_on_idle"] = resolution_result(sa, "sleep_on_idle")
        res["no_overlap"] = resolution_result(sa, "disable_overlap_schedule")
        print(json.dumps(res))
    """, plugin_site, SGLANG_USE_CPU_ENGINE="1")
    assert out["platform"] == "Eagle3CpuPlatform" and out["is_cpu"]
    assert out["has_amx"] is True          # the intel_amx attention backend's ops exist ...
    assert out["layers_amx"] is False      # ... but no AMX weight packing is claimed
    assert out["same_op"]
    assert "fused_experts_cpu" in out["from_import"]
    assert "fused_experts_cpu" in out["attr"] and "eagle3_backend" in out["attr"]
    assert "sgl_kernel.kvcacheio" in out["submodule"]
    assert out["attention_backend"] == "intel_amx"   # not rewritten to torch_native
    assert out["sleep_on_idle"] is True
    assert out["no_overlap"] is (len(os.sched_getaffinity(0)) <= 4)   # few CPUs: no overlap thread
    assert out["gomp"] == "0"                        # idle OpenMP threads sleep (children inherit)


def test_overlap_schedule_default_follows_cpus_and_env(monkeypatch):
    from eagle3_backend.cpu import platform as plat

    monkeypatch.delenv(plat.ENV_OVERLAP, raising=False)
    monkeypatch.setattr(plat, "_usable_cpus", lambda: 2)
    assert plat.overlap_schedule_off_by_default() is True
    monkeypatch.setenv(plat.ENV_OVERLAP, "1")
    assert plat.overlap_schedule_off_by_default() is False
    monkeypatch.delenv(plat.ENV_OVERLAP)
    monkeypatch.setattr(plat, "_usable_cpus", lambda: 32)
    assert plat.overlap_schedule_off_by_default() is False
