"""Real ``python -m sglang.launch_server`` processes on the CPU engine (marker ``server``).

The refusals (a launch that ends before any weight is loaded, saying what
``eagle3 validate`` says) are in ``test_verdicts.py``; here, launches that get
past the checks. The CPU engine needs the package's ``sglang.srt.platforms``
entry point (eagle3_backend.cpu) for SGLang's ``sgl_kernel`` ops; both entry
points come from pyproject.toml (see ``plugin_site``). Every launch runs in its
own process group, bounded in time, and the group is stopped by the test.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from serving_drafts import HIDDEN, write_draft
from serving_launch import declared_entry_points, launch_server, running_server, subprocess_env

pytestmark = [pytest.mark.server, pytest.mark.sglang]

CHECKS_TIMEOUT = 300  # s to the end of the pre-load checks (~40 s on 2 loaded cores)
SPEC = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--dtype", "float32"]


@pytest.fixture(scope="module")
def server_env(plugin_site):
    pytest.importorskip("sglang")
    platforms = declared_entry_points().get("sglang.srt.platforms", {})
    assert platforms, ("pyproject.toml declares no sglang.srt.platforms entry point; SGLang's CPU "
                       "engine cannot import sgl_kernel without the eagle3_backend.cpu platform")
    return subprocess_env(plugin_site)


def test_unrecorded_layout_starts_with_the_default_said_loudly(tmp_path, tiny_target_dir, server_env):
    draft = write_draft(tmp_path / "draft", layout=None)
    run = launch_server(["--model-path", str(tiny_target_dir), "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", str(draft), *SPEC],
                        server_env, tmp_path / "server.log", timeout=CHECKS_TIMEOUT,
                        stop_when="eagle3_backend: pre-load checks passed")
    assert run.returncode is None, run.output[-3000:]  # it was starting; the test stopped it
    assert ("RECORDS NO LAYOUT; serving the engine default [layer_input:2, layer_input:4, "
            "layer_input:5]") in run.output
    assert "(assumed-default) -> fc input 192" in run.output


@pytest.mark.slow
def test_embed_slot_in_any_order_is_served_and_self_checked(tmp_path, tiny_target_dir, server_env):
    """End to end: layout [layer_input:5, embed, layer_input:2] captured, packed, checked, served,
    and the captured fc input equals the target's hidden states as HF transformers computes them."""
    layout = ["layer_input:5", "embed", "layer_input:2"]
    draft = write_draft(tmp_path / "draft", layout=layout)
    args = ["--model-path", str(tiny_target_dir), "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(draft), *SPEC]
    env = {**server_env, "EAGLE3_DUMP_FC_INPUT": str(tmp_path / "fc_{pid}.safetensors")}
    with running_server(args, env, tmp_path / "server.log") as server:
        assert server.wait_for("The server is fired up and ready to roll!", timeout=600), server.output[-4000:]
        body = json.dumps({"text": "The capital of France is",
                           "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            reply = json.loads(resp.read())
        out = server.output
    assert "eagle3_backend: draft weights: 15 tensors, every one consumed by SGLang's loader" in out
    assert ("LlamaForCausalLM captures [layer_input:5, embed, layer_input:2]: layer inputs [0, 2, 5] "
            "(SGLang ids [-1, 1, 4])") in out
    assert "EAGLE-3 layout [layer_input:5, embed, layer_input:2] -> fc input 192 (checked)" in out
    assert len(reply["output_ids"]) == 8
    assert reply["meta_info"]["spec_verify_ct"] >= 1 and reply["meta_info"]["spec_accept_length"] >= 1.0

    # The fc input SGLang built equals HF's hidden_states[k] (the residual stream entering
    # layer k; 0 = the embedding), slot by slot in layout order.
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    (dump,) = tmp_path.glob("fc_*.safetensors")
    got = load_file(str(dump))
    ids, fc = got["input_ids"].long(), got["fc_input"]  # [T], [T, 3*H]
    model = LlamaForCausalLM.from_pretrained(tiny_target_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        hs = model(ids[None], output_hidden_states=True).hidden_states  # L+1 x [1, T, H]
    for j, source in enumerate(layout):
        k = 0 if source == "embed" else int(source.split(":")[1])
        want = hs[k][0]
        slot = fc[:, j * HIDDEN:(j + 1) * HIDDEN]
        err = (slot - want).abs().max().item()
        assert err <= 1e-4 * max(1.0, want.abs().max().item()), (source, err)
        if source == "embed":
            assert torch.equal(slot, want), "the embed slot is the embedding, bit for bit"
