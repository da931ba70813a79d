"""The live-draft admin through real SGLang on this CPU (issue 17, first slice).

One bounded server launch: a small random Llama target (``tiny_targets``, echo 0.35, input
ids only) with the echo draft, EAGLE-3 chain, ``--api-key``. In order, on that server:

* ``GET /eagle3/draft`` needs the key (SGLang's rules) and reports the draft exactly: path,
  layout, a SHA-256 of its weights, load time, and acceptance counted since load that equals
  the sum of the responses' own ``spec_verify_ct``;
* ``POST /update_weights_from_disk`` of a copy of the target: the target only; the draft's
  weights hash the same, the outputs and per-prompt acceptance are identical to before;
  of the draft checkpoint itself: refused, naming ``/eagle3/draft/swap``;
* ``POST /eagle3/draft/swap``: another layout, a changed config field, a truncated checkpoint
  and a bad body are refused with their exact words (the restart command included); a
  compatible draft is validated and answered 501 (the swap itself is not built); the draft
  never changes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cpu_drafts import make_echo_draft, make_random_draft

from eagle3_backend.cpu.launch import CpuServer

pytestmark = [pytest.mark.server, pytest.mark.sglang]

REPO = Path(__file__).resolve().parents[2]
LAYOUT = "[embed, layer_input:3, layer_input:6]"
OTHER_LAYOUT = "[layer_input:2, layer_input:4, layer_input:5]"
KEY = "eagle3-test-key"
NUM_PROMPTS, NEW_TOKENS = 4, 16
START_TIMEOUT, REQUEST_TIMEOUT = 420.0, 120.0


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("draft-admin")


@pytest.fixture(scope="module")
def target(work) -> Path:
    from eagle3_backend.cpu.tiny_targets import write_target

    return write_target("llama", work / "target", echo=0.35)


@pytest.fixture(scope="module")
def draft(work, target) -> Path:
    return make_echo_draft(work / "echo-draft", target, layout=LAYOUT)


@pytest.fixture(scope="module")
def prompts(family_prompts) -> dict[str, tuple[list[int], int]]:
    return {name: (ids, NEW_TOKENS) for name, (ids, _) in list(family_prompts.items())[:NUM_PROMPTS]}


@pytest.fixture(scope="module")
def server(target, draft, plugin_site, work):
    from cpu_testutil import family_spec

    spec = family_spec(target, draft)
    spec = dataclasses.replace(spec, extra_args=(*spec.extra_args, "--api-key", KEY))
    srv = CpuServer(spec, work / "server.log", pythonpath=(str(plugin_site), str(REPO)),
                    start_timeout=START_TIMEOUT, api_key=KEY)
    started = time.time()
    with srv:
        srv.started_at = started
        yield srv


def _launch_argv(server) -> list[str]:
    """The launcher's sys.argv: ``python -m sglang.launch_server ARGS`` (argv[0] is the module file)."""
    import sglang.launch_server as ls

    return [ls.__file__, *server.spec.args(server.port)]


def _run(server, prompts) -> dict[str, dict]:
    return {n: server.generate(ids, k, timeout=REQUEST_TIMEOUT) for n, (ids, k) in prompts.items()}


def _info(server) -> dict:
    status, body = server.get("/eagle3/draft", timeout=REQUEST_TIMEOUT)
    assert status == 200, body
    return body


def test_info_needs_the_key_and_reports_the_draft(server, draft, prompts):
    req = urllib.request.Request(server.url + "/eagle3/draft")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 401 and json.loads(err.value.read()) == {"error": "Unauthorized"}

    before = _info(server)
    assert set(before) == {"path", "layout", "weights_sha256", "weights_tensors", "loaded_at", "acceptance"}
    assert before["path"] == str(draft) and before["layout"] == LAYOUT
    assert len(before["weights_sha256"]) == 64 and int(before["weights_sha256"], 16) >= 0
    # fc, the layer's qkv/o/gate_up/down and two norms, hidden_norm, the final norm, lm_head,
    # hot_token_id; embed_tokens is the target's parameter and not counted
    assert before["weights_tensors"] == 11
    assert server.started_at <= before["loaded_at"] <= time.time()

    outs = _run(server, prompts)
    after = _info(server)
    steps = sum(int(o["meta_info"]["spec_verify_ct"]) for o in outs.values())
    acc, acc0 = after["acceptance"], before["acceptance"]
    assert acc["verify_steps"] - acc0["verify_steps"] == steps
    # the scheduler counts what each verify step committed, before the length limit cuts the
    # last block (at most num_steps = 3 tokens past it a request); the prefill's token is no step's
    tokens = sum(len(o["output_ids"]) - 1 for o in outs.values())
    assert tokens <= acc["accepted_tokens"] - acc0["accepted_tokens"] <= tokens + 3 * len(outs)
    assert acc["accept_length"] == round(acc["accepted_tokens"] / acc["verify_steps"], 6)
    assert after["weights_sha256"] == before["weights_sha256"]
    server.first_outputs, server.first_info = outs, after
    server.first_run_counts = _counts(after, before)


def _counts(after: dict, before: dict) -> tuple[int, int, int]:
    keys = ("verify_steps", "accepted_tokens", "correct_drafts")
    return tuple(after["acceptance"][k] - before["acceptance"][k] for k in keys)


def test_update_weights_from_disk_updates_the_target_only(server, target, draft, prompts, work):
    from eagle3_backend.serving import drafts

    first, info1 = server.first_outputs, server.first_info
    copy = work / "target-copy"
    shutil.copytree(target, copy, dirs_exist_ok=True)
    status, body = server.post("/update_weights_from_disk", {"model_path": str(copy)}, timeout=REQUEST_TIMEOUT)
    assert status == 200, body
    assert body == {"success": True, "num_paused_requests": 0,
                    "message": f"Succeeded to update model weights. {drafts.disk_note(str(draft))}"}
    info2 = _info(server)
    assert info2["weights_sha256"] == info1["weights_sha256"] and info2["path"] == str(draft)
    assert info2["loaded_at"] == info1["loaded_at"]

    again = _run(server, prompts)
    for name, out in again.items():
        assert out["output_ids"] == first[name]["output_ids"], name
        for key in ("spec_verify_ct", "spec_accept_length"):
            assert out["meta_info"][key] == first[name]["meta_info"][key], (name, key)
    info3 = _info(server)
    # the same verify steps committing the same tokens as the first run (counted from load)
    run1, run2 = server.first_run_counts, _counts(info3, info2)
    assert run2 == run1 and run1[0] > 0

    status, body = server.post("/update_weights_from_disk", {"model_path": str(draft)}, timeout=REQUEST_TIMEOUT)
    assert status == 400, body
    assert body == {"success": False, "num_paused_requests": 0,
                    "message": drafts.disk_refusal(str(draft), ["LlamaForCausalLMEagle3"])}
    assert _info(server)["weights_sha256"] == info1["weights_sha256"]


def test_swap_validates_and_refuses_without_touching_weights(server, target, draft, work):
    from eagle3_backend.checkpoint.suite import LaunchArgs
    from eagle3_backend.serving import checks, drafts
    from eagle3_backend.target import TargetInfo

    argv = _launch_argv(server)
    before = _info(server)

    def swap(body):
        return server.post("/eagle3/draft/swap", body, timeout=REQUEST_TIMEOUT)

    other = make_random_draft(work / "other-layout", target, layout=OTHER_LAYOUT)
    status, body = swap({"path": str(other)})
    cmd = drafts.restart_command(argv, str(other))
    assert cmd.startswith("python -m sglang.launch_server --model-path ") and f"--speculative-draft-model-path {other}" in cmd
    assert status == 400 and body == {
        "success": False, "stage": "compatibility", "restart_command": cmd,
        "message": (f"eagle3_backend refuses the swap to {other}: its layout is {OTHER_LAYOUT} but this "
                    f"server captures {LAYOUT} for draft {draft}; the target's capture is fixed at "
                    f"start, so a swap keeps the layout. Restart with: {cmd}")}

    eps = work / "eps-draft"
    shutil.copytree(draft, eps, dirs_exist_ok=True)
    cfg = json.loads((eps / "config.json").read_text())
    old_eps = cfg["rms_norm_eps"]
    cfg["rms_norm_eps"] = 1e-3
    (eps / "config.json").write_text(json.dumps(cfg))
    status, body = swap({"path": str(eps)})
    cmd = drafts.restart_command(argv, str(eps))
    assert status == 400 and body["stage"] == "compatibility" and body["restart_command"] == cmd
    assert body["message"] == (
        f"eagle3_backend refuses the swap to {eps}: it differs from the served draft {draft} in "
        f"rms_norm_eps {float(old_eps)} -> 0.001; SGLang built the draft's modules from these at start, so "
        f"a swap in place cannot change them. Restart with: {cmd}")

    broken = work / "truncated-draft"
    shutil.copytree(draft, broken, dirs_exist_ok=True)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    status, body = swap({"path": str(broken)})
    launch = LaunchArgs(algorithm="EAGLE3", draft_path=str(broken), num_steps=3, topk=1, num_draft_tokens=4)
    with pytest.raises(Exception) as offline:
        checks.check_launch(launch, TargetInfo.from_path(str(target)))
    expected = str(offline.value).replace(checks.REFUSES, f"eagle3_backend refuses the swap to {broken}", 1)
    assert status == 400 and body == {"success": False, "stage": "validate", "message": expected}

    status, body = swap({"draft": "x"})
    assert status == 400 and body["stage"] == "request"
    assert body["message"] == ('eagle3_backend: /eagle3/draft/swap expects a JSON body {"path": DIR}; '
                               "got {'draft': 'x'}.")

    same = work / "echo-copy"
    shutil.copytree(draft, same, dirs_exist_ok=True)
    status, body = swap({"path": str(same)})
    cmd = drafts.restart_command(argv, str(same))
    assert status == 501 and body == {
        "success": False, "stage": "not-implemented", "validated": True, "restart_command": cmd,
        "message": (f"eagle3_backend: draft {same} passes the start-up checks on this target and "
                    f"matches the served draft's layout {LAYOUT} and shape; swapping a live server's "
                    f"draft is not built yet, so nothing changed and {draft} still serves. To serve "
                    f"the new draft now, restart with: {cmd}")}

    after = _info(server)
    assert {k: after[k] for k in ("path", "layout", "weights_sha256", "loaded_at")} == {
        k: before[k] for k in ("path", "layout", "weights_sha256", "loaded_at")}
    assert "eagle3_backend: added GET /eagle3/draft and POST /eagle3/draft/swap" in server.log_text()
