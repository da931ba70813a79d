"""Tensor parallel 2 on this CPU, through real SGLang: gloo groups (the CPU platform's hook keeps
PyNccl, CUDA-only, out of them), one OMP thread per rank bound with
``SGLANG_CPU_OMP_THREADS_BIND="0|1"`` (one NUMA node), ``--max-total-tokens`` given.

Every small target but Qwen2 (Llama, DeepSeek-V3, Kimi-K2, GLM-4.5 MoE, GLM-4.7-Flash,
Qwen3-MoE, Qwen3, gpt-oss) served at ``--tp-size 2`` with EAGLE-3 gives, token for token, the
tp 1 target-only server's outputs; the plugin's pre-load checks run once (in the launcher),
and every rank self-checks its fc input, the embed slot against its own vocabulary shard of
the embedding.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from eagle3_backend.cpu.launch import CpuServer

from cpu_drafts import make_echo_draft
from cpu_testutil import REPO, REQUEST_TIMEOUT, START_TIMEOUT, assert_fc_input_matches_hf, assert_same_tokens, family_spec

pytestmark = [pytest.mark.server, pytest.mark.sglang]

TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}
LAYOUT = {"llama": "[layer_input:5, embed, layer_input:2]",
          "deepseek_v3": "[embed, layer_input:1, layer_input:6]",
          "kimi_k2": "[embed, layer_input:1, layer_input:6]",
          "qwen3": "[layer_input:7, embed, layer_input:3]",
          "glm4_moe": "[layer_input:6, layer_input:1, embed]",
          "qwen3_moe": "[embed, layer_input:4, layer_input:7]",
          "gpt_oss": "[layer_input:8, embed, layer_input:3]",
          "glm4_moe_lite": "[layer_input:1, embed, layer_input:5]"}


@pytest.mark.parametrize("family", list(LAYOUT))
def test_tp2_eagle3_equals_tp1_target_only(family, family_target, family_reference, family_prompts,
                                           plugin_site, tmp_path):
    target, layout = family_target(family), LAYOUT[family]
    draft = make_echo_draft(tmp_path / "echo-draft", target, layout=layout)
    env = {**TP_ENV, "EAGLE3_DUMP_FC_INPUT": str(tmp_path / "fc_{pid}.safetensors")}
    with ThreadPoolExecutor(1) as pool:  # the tp 1 reference starts beside it, unless cached
        ref = pool.submit(family_reference, family)
        with CpuServer(family_spec(target, draft, tp=2), tmp_path / "tp2.log", start_timeout=START_TIMEOUT,
                       pythonpath=(str(plugin_site), str(REPO)), env_extra=env) as srv:
            outs = _run(srv, family_prompts)
            if family == "llama":
                _swap_on_both_ranks(srv, draft, tmp_path, family_prompts, outs)
            text = srv.log_text()
        reference = ref.result()
    assert_same_tokens(outs, reference, f"{family} tp 2 EAGLE-3 vs tp 1 target-only")
    lengths = [float(o["meta_info"]["spec_accept_length"]) for o in outs.values()]
    assert sum(lengths) / len(lengths) > 2.0, lengths

    assert text.count("eagle3_backend: pre-load checks passed") == 1, "the launcher checks once"
    checked = re.findall(r"\[[^\]]* (TP\d)\] EAGLE-3 layout (\[[^\]]*\]) -> fc input (\d+) \(checked\)"
                         r"; embed slot on this rank's vocabulary shard \[(\d+), (\d+)\): (\d+) of (\d+) tokens",
                         text)
    assert sorted(c[0] for c in checked) == ["TP0", "TP1"], text[-3000:]
    shards = sorted((int(c[3]), int(c[4])) for c in checked)
    assert shards == [(0, 24576), (24576, 49152)], shards  # each rank its half of the vocabulary
    assert all(c[1] == layout for c in checked)
    # both ranks capture the same replicated residual stream; each dumped what it packed
    dumps = sorted(tmp_path.glob("fc_*.safetensors"))
    assert len(dumps) == 2, dumps
    for dump in dumps:
        assert_fc_input_matches_hf(dump, target, layout)


def _run(srv, prompts) -> dict[str, dict]:
    return {name: srv.generate(ids, n, timeout=REQUEST_TIMEOUT) for name, (ids, n) in prompts.items()}


def _swap_on_both_ranks(srv, echo, tmp_path, prompts, first) -> None:
    """The draft swapped at tp 2: to a scrambled copy (kept although worse), then to a fresh
    copy of the echo draft. Were a rank's shard left behind in either swap, the echo draft's
    per-prompt acceptance would not come back exactly."""
    import shutil

    from safetensors.torch import load_file, save_file
    import torch

    scrambled, fresh = tmp_path / "scrambled", tmp_path / "echo-again"
    for d in (scrambled, fresh):
        shutil.copytree(echo, d)
    t = load_file(str(scrambled / "model.safetensors"))
    t["lm_head.weight"] = torch.roll(t["lm_head.weight"], 1, dims=0).contiguous()
    save_file(t, str(scrambled / "model.safetensors"), metadata={"format": "pt"})
    _, info = srv.get("/eagle3/draft", timeout=REQUEST_TIMEOUT)
    probes = [ids for ids, _ in list(prompts.values())[:2]]
    status, body = srv.post("/eagle3/draft/swap", {"path": str(scrambled), "probe_input_ids": probes,
                                                   "probe_tokens": 16, "keep_if_worse": True}, timeout=REQUEST_TIMEOUT)
    assert status == 200 and body["staged"]["ranks"] == 2, body
    canary = body["canary"]
    assert canary["accept_length_after"] < canary["accept_length_before"] - 0.5 and canary["outputs_identical"]
    status, body = srv.post("/eagle3/draft/swap", {"path": str(fresh), "probe_prompts": 0}, timeout=REQUEST_TIMEOUT)
    assert status == 200 and body["staged"]["ranks"] == 2 and "canary" not in body, body
    again = _run(srv, prompts)
    for name, out in again.items():
        assert out["output_ids"] == first[name]["output_ids"], name
        assert out["meta_info"]["spec_verify_ct"] == first[name]["meta_info"]["spec_verify_ct"], name
    _, after = srv.get("/eagle3/draft", timeout=REQUEST_TIMEOUT)
    assert after["path"] == str(fresh) and after["weights_sha256"] == info["weights_sha256"]
