"""The live-draft admin through real SGLang on this CPU (issue 17).

One bounded server launch: a small random Llama target (``tiny_targets``, echo 0.35) served
with EAGLE-3 chain and ``--api-key``, starting from a scrambled echo draft (its lm_head rows
rolled: almost never accepted). In order, on that server:

* ``GET /eagle3/draft`` needs the key (SGLang's rules) and reports the draft exactly: path,
  layout, a SHA-256 of its weights, load time, and acceptance counted since load that equals
  the sum of the responses' own ``spec_verify_ct``;
* ``POST /update_weights_from_disk`` of a copy of the target: the target only; of the draft
  checkpoint itself: refused, naming ``/eagle3/draft/swap``;
* ``POST /eagle3/draft/swap`` refuses another layout, a changed config field, a truncated
  and a NaN checkpoint and bad bodies with their exact words; the draft never changes;
* a swap to the echo draft goes live: the canary's acceptance rises, outputs stay identical;
  a swap to a worse draft is rolled back (and kept with ``keep_if_worse``, then
  ``/eagle3/draft/rollback`` restores the exact weights); a swap under concurrent requests
  answers every one of them identically, and a second swap meanwhile is refused (409).
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
import torch
from cpu_drafts import make_echo_draft, make_random_draft

from eagle3_backend.cpu.launch import CpuServer

pytestmark = [pytest.mark.server, pytest.mark.sglang]

REPO = Path(__file__).resolve().parents[2]
LAYOUT = "[embed, layer_input:3, layer_input:6]"
OTHER_LAYOUT = "[layer_input:2, layer_input:4, layer_input:5]"
KEY = "eagle3-test-key"
NUM_PROMPTS = 4
START_TIMEOUT, REQUEST_TIMEOUT = 420.0, 120.0


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("draft-admin")


@pytest.fixture(scope="module")
def target(family_target) -> Path:
    return family_target("llama")


@pytest.fixture(scope="module")
def echo(work, target) -> Path:
    return make_echo_draft(work / "echo-draft", target, layout=LAYOUT)


def _variant(src: Path, out: Path, edit) -> Path:
    """A copy of the draft at ``src`` whose tensors ``edit`` changed (same names and shapes)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out, dirs_exist_ok=True)
    tensors = load_file(str(out / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _rolled(shift: int, zero_embed: bool = False):
    def edit(t):
        t["lm_head.weight"] = torch.roll(t["lm_head.weight"], shifts=shift, dims=0).contiguous()
        if zero_embed:
            t["embed_tokens.weight"] = torch.zeros_like(t["embed_tokens.weight"])
    return edit


def _names(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.fixture(scope="module")
def draft(work, echo) -> Path:
    """The draft the server starts with: the echo draft predicting the token after the echo."""
    return _variant(echo, work / "scrambled", _rolled(1))


@pytest.fixture(scope="module")
def prompts(family_prompts) -> dict[str, tuple[list[int], int]]:
    return dict(list(family_prompts.items())[:NUM_PROMPTS])


@pytest.fixture(scope="module")
def server(target, draft, plugin_site, work, family_reference):
    from concurrent.futures import ThreadPoolExecutor

    from cpu_testutil import family_spec

    spec = family_spec(target, draft)  # with the tokenizer: the canary's default probes are texts
    extra = tuple(a for a in spec.extra_args if a != "--skip-tokenizer-init")
    spec = dataclasses.replace(spec, extra_args=(*extra, "--api-key", KEY))
    srv = CpuServer(spec, work / "server.log", pythonpath=(str(plugin_site), str(REPO)),
                    start_timeout=START_TIMEOUT, api_key=KEY)
    started = time.time()
    with ThreadPoolExecutor(1) as pool:  # the target-only reference starts beside it, unless cached
        ref = pool.submit(family_reference, "llama")
        with srv:
            srv.started_at, srv.reference = started, ref
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
    """(Every later run is compared with this first one, which equals target-only.)"""
    req = urllib.request.Request(server.url + "/eagle3/draft")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 401 and json.loads(err.value.read()) == {"error": "Unauthorized"}

    before = _info(server)
    assert set(before) == {"path", "layout", "kept", "weights_sha256", "weights_tensors", "loaded_at",
                           "acceptance"}
    assert before["kept"] is None
    assert before["path"] == str(draft) and before["layout"] == LAYOUT
    assert len(before["weights_sha256"]) == 64 and int(before["weights_sha256"], 16) >= 0
    # fc, the layer's qkv/o/gate_up/down and two norms, hidden_norm, the final norm, lm_head,
    # hot_token_id; embed_tokens is the target's parameter and not counted
    assert before["weights_tensors"] == 11
    assert server.started_at <= before["loaded_at"] <= time.time()

    outs = _run(server, prompts)
    reference = server.reference.result()  # the target-only server's greedy outputs
    for name, out in outs.items():
        assert out["output_ids"] == reference[name]["output_ids"], name
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


def test_swap_validates_and_refuses_without_touching_weights(server, target, draft, work, prompts, capsys):
    from eagle3_backend.checkpoint.suite import LaunchArgs
    from eagle3_backend.serving import checks, drafts
    from eagle3_backend.target import TargetInfo

    argv = _launch_argv(server)
    before = _info(server)

    def swap(body):
        return server.post("/eagle3/draft/swap", body, timeout=REQUEST_TIMEOUT)

    other = make_random_draft(work / "other-layout", target, layout=OTHER_LAYOUT)
    status, body = swap({"path": str(other)})
    other_refusal = body["message"]
    cmd = drafts.restart_command(argv, str(other), env=server._env())  # the server's environment
    assert cmd.startswith("SGLANG_USE_CPU_ENGINE=1 ") and f"--speculative-draft-model-path {other}" in cmd
    assert "python -m sglang.launch_server --model-path " in cmd
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
    cmd = drafts.restart_command(argv, str(eps), env=server._env())
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

    nan = _variant(draft, work / "nan-draft", lambda t: t["fc.weight"].__setitem__((0, 0), float("nan")))
    status, body = swap({"path": str(nan)})
    with pytest.raises(Exception) as offline:
        checks.check_launch(dataclasses.replace(launch, draft_path=str(nan)), TargetInfo.from_path(str(target)))
    expected = str(offline.value).replace(checks.REFUSES, f"eagle3_backend refuses the swap to {nan}", 1)
    assert "1 NaN and 0 Inf value(s)" in expected
    assert status == 400 and body == {"success": False, "stage": "validate", "message": expected}

    status, body = swap({"draft": "x"})
    assert status == 400 and body["stage"] == "request"
    assert body["message"] == ('eagle3_backend: /eagle3/draft/swap expects a JSON body {"path": DIR}; '
                               "got {'draft': 'x'}.")
    status, body = swap({"path": str(draft), "probes": 3})
    assert status == 400 and body["message"].startswith(
        "eagle3_backend: /eagle3/draft/swap does not know ['probes'] (it takes ")
    status, body = swap({"path": str(draft), "margin": -1})
    assert status == 400 and "expects margin as a number >= 0" in body["message"]

    from eagle3_backend import cli

    assert cli.main(["swap", "--url", server.url, "--draft", str(other), "--api-key", KEY]) == 2
    assert capsys.readouterr().out == f"result:    compatibility: {other_refusal}\n"
    assert cli.main(["swap", "--url", server.url, "--rollback"]) == 2  # no key
    assert capsys.readouterr().out == "refused: the server wants its API key (--api-key or $SGLANG_API_KEY)\n"

    after = _info(server)
    assert {k: after[k] for k in ("path", "layout", "weights_sha256", "loaded_at")} == {
        k: before[k] for k in ("path", "layout", "weights_sha256", "loaded_at")}
    assert ("eagle3_backend: added GET /eagle3/draft, POST /eagle3/draft/swap and POST "
            "/eagle3/draft/rollback (admin routes)") in server.log_text()
    again = _run(server, dict(list(prompts.items())[:1]))
    name = next(iter(again))
    assert again[name]["output_ids"] == server.first_outputs[name]["output_ids"]


def _swap(server, body) -> tuple[int, dict]:
    return server.post("/eagle3/draft/swap", body, timeout=REQUEST_TIMEOUT)


def _accept(outs: dict[str, dict]) -> float:
    return sum(len(o["output_ids"]) for o in outs.values()) / sum(
        int(o["meta_info"]["spec_verify_ct"]) for o in outs.values())


PROBES = {"probe_prompts": 4, "probe_tokens": 16}


def test_swap_to_a_better_draft_goes_live(server, draft, echo, prompts):
    before = _info(server)
    status, body = _swap(server, {"path": str(echo), **PROBES})
    assert status == 200, body
    canary = body["canary"]
    assert body["success"] is True and body["stage"] == "live" and body["validated"] is True
    assert body["path"] == str(echo) and body["previous"] == str(draft)
    # the old draft's own figure since its load: the runs before, and the canary's probes with it
    served = body["previous_acceptance"]
    assert set(served) == set(before["acceptance"])
    assert served["verify_steps"] > before["acceptance"]["verify_steps"]
    # the checkpoint's embed_tokens went to a write-nothing placeholder: the served one is the target's
    assert "embed_tokens.weight" in _names(echo)
    assert body["committed"]["left_to_target"] == ["model.embed_tokens.weight"]
    assert body["committed"]["cache_flushed"] is True
    assert canary["prompts"] == 4 and canary["max_new_tokens"] == 16 and canary["verdict"] == "kept"
    assert canary["outputs_identical"] is True  # fp32 greedy: the target decides every token
    assert canary["unmeasured"] == [0, 0]  # every probe came back with SGLang's spec metrics
    assert canary["accept_length_after"] > canary["accept_length_before"] + 0.5, canary
    assert body["message"] == (
        f"eagle3_backend: {echo} serves now (acceptance on 4 probe prompts "
        f"{canary['accept_length_before']:.3f} -> {canary['accept_length_after']:.3f}); {draft} is kept "
        f"for /eagle3/draft/rollback.")

    info = _info(server)
    assert info["path"] == str(echo) and info["kept"] == str(draft) and info["layout"] == LAYOUT
    assert info["weights_sha256"] != before["weights_sha256"] and info["loaded_at"] > before["loaded_at"]
    assert info["weights_tensors"] == before["weights_tensors"]
    outs = _run(server, prompts)
    for name, out in outs.items():  # identical to the first run's, with the other draft
        assert out["output_ids"] == server.first_outputs[name]["output_ids"], name
    assert _accept(outs) > _accept(server.first_outputs) + 0.5
    # counted from the swap on: the canary's probes, then this run's verify steps
    probes, acc = info["acceptance"]["verify_steps"], _info(server)["acceptance"]
    assert 0 < probes < before["acceptance"]["verify_steps"]
    assert acc["verify_steps"] - probes == sum(int(o["meta_info"]["spec_verify_ct"]) for o in outs.values())
    server.echo_digest, server.draft_digest = info["weights_sha256"], before["weights_sha256"]


def test_a_worse_draft_is_rolled_back_or_kept_when_asked(server, echo, work, prompts, capsys):
    # its embed_tokens is zeros: were it loaded into the target's embedding, outputs would change
    worse = _variant(echo, work / "scrambled-2", _rolled(2, zero_embed=True))
    status, body = _swap(server, {"path": str(worse), **PROBES})
    canary = body["canary"]
    assert status == 422 and body["success"] is False and body["stage"] == "rolled-back", body
    assert canary["verdict"] == "rolled back" and canary["outputs_identical"] is True
    assert canary["accept_length_after"] < canary["accept_length_before"] - 0.5
    assert body["message"] == (
        f"eagle3_backend: {worse} did worse than {echo} (acceptance on 4 probe prompts "
        f"{canary['accept_length_before']:.3f} -> {canary['accept_length_after']:.3f}, margin 0.05); "
        f"rolled back, {echo} serves. Send keep_if_worse to keep it anyway.")
    info = _info(server)
    assert info["path"] == str(echo) and info["weights_sha256"] == server.echo_digest
    assert info["kept"] == str(worse)

    from eagle3_backend import cli

    argv = ["swap", "--url", server.url, "--draft", str(worse), "--keep-if-worse", "--api-key", KEY,
            "--probe-prompts", "4", "--probe-tokens", "16"]
    code = cli.main(argv + ["--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0 and body["status"] == 200 and body["canary"]["verdict"] == "kept despite worse", body
    assert body["canary"]["outputs_identical"] is True
    assert capsys.readouterr().out == ""
    assert cli.swap_lines(200, body) == [
        f"validated: {worse} on the running target",
        f"staged:    {body['staged']['seconds']:.2f} s, checked on 1 rank",
        f"committed: {body['committed']['seconds']:.2f} s in place; prefix cache flushed",
        f"canary:    4 probe prompts x 16 tokens: acceptance {body['canary']['accept_length_before']:.3f} -> "
        f"{body['canary']['accept_length_after']:.3f} (margin 0.05); outputs identical; kept despite worse",
        f"result:    live: {body['message']}"]
    assert _info(server)["path"] == str(worse)
    for name, out in _run(server, dict(list(prompts.items())[:2])).items():
        assert out["output_ids"] == server.first_outputs[name]["output_ids"], name

    status, body = server.post("/eagle3/draft/rollback", {}, timeout=REQUEST_TIMEOUT)
    assert status == 200 and body == {
        "success": True, "stage": "live", "path": str(echo), "previous": str(worse),
        "message": f"eagle3_backend: rolled back; {echo} serves, {worse} is kept."}
    info = _info(server)
    assert info["path"] == str(echo) and info["kept"] == str(worse)
    assert info["weights_sha256"] == server.echo_digest  # the exact weights, back in place
    outs = _run(server, dict(list(prompts.items())[:2]))
    for name, out in outs.items():
        assert out["output_ids"] == server.first_outputs[name]["output_ids"], name


def test_a_swap_under_load_answers_every_request(server, draft, echo, prompts):
    from concurrent.futures import ThreadPoolExecutor

    load = {f"{n}-{i}": v for i in range(3) for n, v in prompts.items()}
    with ThreadPoolExecutor(max_workers=len(load) + 1) as pool:
        futures = {n: pool.submit(server.generate, ids, k, timeout=REQUEST_TIMEOUT)
                   for n, (ids, k) in load.items()}
        swap = pool.submit(_swap, server, {"path": str(draft), "keep_if_worse": True, **PROBES})
        started = f"eagle3_backend: draft swap {echo} -> {draft}: validated; 4 canary probes of 16 tokens"
        deadline = time.time() + REQUEST_TIMEOUT
        while started not in server.log_text() and time.time() < deadline and not swap.done():
            time.sleep(0.05)
        status2, body2 = _swap(server, {"path": str(echo)})
        status, body = swap.result()
        outs = {n: f.result() for n, f in futures.items()}
    assert status == 200 and body["path"] == str(draft) and body["previous"] == str(echo), body
    assert status2 == 409 and body2 == {
        "success": False, "stage": "request",
        "message": f"eagle3_backend: a draft swap is already running; {echo} was not considered. "
                   f"Retry when it has finished."}
    for name, out in outs.items():
        assert out["output_ids"] == server.first_outputs[name.rsplit("-", 1)[0]]["output_ids"], name
    info = _info(server)
    assert info["path"] == str(draft) and info["weights_sha256"] == server.draft_digest
    log = server.log_text()
    assert f"eagle3_backend: draft swap {echo} -> {draft} (layout {LAYOUT}): live; {body['message']}" in log
