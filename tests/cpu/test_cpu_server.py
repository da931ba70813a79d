"""Real SGLang EAGLE-3 serving on this CPU: speculative output == target-only output (fp32).

Four bounded server launches on the bundled SmolLM2-135M (fp32), one at a time:
target-only (the reference), EAGLE-3 chain with a random draft (default
layout), after a restart EAGLE-3 with the echo draft (a second, different
layout with an ``embed`` slot; accepted on repetitive text), and EAGLE-3
tree (topk 4) with the echo draft. Every request is greedy, sequential and
time-bounded; every server process group is stopped by its fixture. The
target-only and echo-draft servers also answer a few OpenAI-client requests
(streaming chat, n > 1, logprobs, a stop string inside an accepted block); the
echo-draft server also answers eagle3 bench's client at concurrency 3, one of the
prompts finishing in its prefill (no speculative metrics, listed apart).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpu_drafts import ECHO_LAYOUT, make_echo_draft, make_random_draft
from cpu_testutil import assert_same_tokens, offline_acceptance

pytestmark = [pytest.mark.server, pytest.mark.sglang]

NUM_MTBENCH = 10          # the chain test compares all of them with the target-only server
NUM_MTBENCH_SUBSET = 4    # the echo-draft and tree tests use the first few (tier time bound)
MTBENCH_NEW_TOKENS = 20
# SmolLM2 answers the first with " apple" x N (one token repeated: the echo draft's
# proposals all match) and the second with "Banana Banana ..." (two tokens per word).
REPEAT_PROMPTS = ("Repeat the word 'apple' twenty times, separated by spaces.",
                  "Repeat the word 'banana' twenty times, separated by spaces.")
REPEAT_NEW_TOKENS = 32
START_TIMEOUT = 420.0
REQUEST_TIMEOUT = 240.0
CLIENT_NEW_TOKENS = 16
# ends inside the first verify block of the echo draft ("apple" from the prefill, then
# " apple" x 4 accepted at once): the server must cut the block after the third " apple"
CLIENT_STOP = " apple apple apple"
# MT-Bench's 6th first turn as raw text (no chat template): SmolLM2 answers <|im_end|> at
# once, so the request finishes in its prefill and SGLang sends no spec_* metric for it
# (docs/sglang-notes.md#metrics); eagle3 bench must list it, not average it in
RAW_PREFILL_ONLY = ("Write a descriptive paragraph about a bustling marketplace, incorporating sensory "
                    "details such as smells, sounds, and visual elements to create an immersive "
                    "experience for the reader.")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prompts(smollm2_dir: Path) -> dict[str, tuple[list[int], int]]:
    """name -> (input ids through the chat template, max_new_tokens)."""
    import transformers

    from eagle3_backend.verify.datasets import Prompt, read_mtbench, render_prompt

    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_dir))
    out = {p.id: (render_prompt(tok, p), MTBENCH_NEW_TOKENS) for p in read_mtbench(limit=NUM_MTBENCH)}
    for i, text in enumerate(REPEAT_PROMPTS):
        out[f"repeat-{i}"] = (render_prompt(tok, Prompt(f"repeat-{i}", (("user", text),))), REPEAT_NEW_TOKENS)
    assert len(out) == NUM_MTBENCH + len(REPEAT_PROMPTS)
    return out


def _server(spec, plugin_site: Path, log: Path):
    from eagle3_backend.cpu.launch import CpuServer

    return CpuServer(spec, log, pythonpath=(str(plugin_site), str(REPO)), start_timeout=START_TIMEOUT)


def _run_all(server, prompts, subset: bool = False) -> dict[str, dict]:
    names = list(prompts)
    if subset:
        names = names[:NUM_MTBENCH_SUBSET] + names[NUM_MTBENCH:]
    return {name: server.generate(*prompts[name], timeout=REQUEST_TIMEOUT) for name in names}


def _accept_length(out: dict) -> float:
    meta = out["meta_info"]
    assert "spec_accept_length" in meta and meta["spec_verify_ct"] > 0, meta
    return float(meta["spec_accept_length"])


def _client_requests(server, prompt_ids: list[int]) -> dict[str, object]:
    """What an OpenAI client sees for the repeat prompt: texts, finish reasons, tokens, logprobs."""
    model = server.spec.target  # SGLang's served model name is the model path
    chat = {"model": model, "messages": [{"role": "user", "content": REPEAT_PROMPTS[0]}],
            "max_tokens": CLIENT_NEW_TOKENS, "temperature": 0}
    out: dict[str, object] = {}

    status, events, done = server.stream("/v1/chat/completions", {**chat, "stream": True},
                                         timeout=REQUEST_TIMEOUT)
    assert status == 200 and done, (status, events[-1:])
    deltas = [c for e in events for c in e["choices"]]
    out["chat stream"] = ("".join(c["delta"].get("content") or "" for c in deltas),
                          [c["finish_reason"] for c in deltas if c["finish_reason"]])
    status, body = server.post("/v1/chat/completions", {**chat, "n": 2}, timeout=REQUEST_TIMEOUT)
    assert status == 200, (status, body)
    out["chat n=2"] = [(c["message"]["content"], c["finish_reason"]) for c in body["choices"]]
    status, body = server.post("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2},
                               timeout=REQUEST_TIMEOUT)
    assert status == 200, (status, body)
    content = body["choices"][0]["logprobs"]["content"]
    out["chat logprobs tokens"] = [(t["token"], [x["token"] for x in t["top_logprobs"]]) for t in content]
    out["chat logprobs"] = [round(t["logprob"], 4) for t in content]
    status, events, done = server.stream("/v1/chat/completions", {**chat, "stream": True, "stop": [CLIENT_STOP]},
                                         timeout=REQUEST_TIMEOUT)
    assert status == 200 and done, (status, events[-1:])
    deltas = [c for e in events for c in e["choices"]]
    out["chat stream stop"] = ("".join(c["delta"].get("content") or "" for c in deltas),
                               [c["finish_reason"] for c in deltas if c["finish_reason"]])
    status, body = server.post("/generate", {"input_ids": prompt_ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": CLIENT_NEW_TOKENS, "stop": CLIENT_STOP}}, timeout=REQUEST_TIMEOUT)
    assert status == 200, (status, body)
    out["generate stop"] = (body["output_ids"], body["meta_info"]["finish_reason"])
    return out


def _bench_level(server, prompts):
    """eagle3 bench's client at concurrency 3: the two repeat prompts (ids) and RAW_PREFILL_ONLY (text)."""
    import asyncio

    from eagle3_backend.verify.bench import BenchSettings, run_level

    sent = [prompts["repeat-0"][0], prompts["repeat-1"][0], RAW_PREFILL_ONLY]
    return asyncio.run(run_level(server.url, sent, 3, BenchSettings(
        max_new_tokens=REPEAT_NEW_TOKENS, timeout_s=REQUEST_TIMEOUT)))


def _assert_same_client_view(got: dict[str, object], ref: dict[str, object], what: str) -> None:
    for name, value in ref.items():
        if name == "chat logprobs":  # fp32, a 4-token verify pass vs 1-token decode
            assert len(got[name]) == len(value) and all(abs(a - b) <= 2e-4 for a, b in zip(got[name], value)), \
                f"{what}: {name} {got[name]} vs target-only {value}"
        else:
            assert got[name] == value, f"{what}: {name} {got[name]!r} vs target-only {value!r}"


@pytest.fixture(scope="module")
def target_only(prompts, smollm2_dir, plugin_site, tmp_path_factory) -> tuple[dict[str, dict], dict[str, object]]:
    """The target-only server's greedy outputs per prompt, and its answers to the client requests."""
    from eagle3_backend.cpu.launch import ServerSpec

    log = tmp_path_factory.mktemp("srv") / "target_only.log"
    with _server(ServerSpec(str(smollm2_dir)), plugin_site, log) as srv:
        outs = _run_all(srv, prompts)
        clients = _client_requests(srv, prompts["repeat-0"][0])
        text = srv.log_text()
    assert "eagle3_backend.cpu platform: LlamaForCausalLM loaded" in text
    assert "'attention_backend': 'intel_amx'" in text
    for name, out in outs.items():
        assert len(out["output_ids"]) > 0, name
        assert "spec_accept_length" not in out["meta_info"]
    # SmolLM2 repeats " apple" (what the echo draft proposes); the stop string is matched
    # (so the EAGLE-3 comparison tests a cut block)
    assert clients["chat stream"] == ("apple" + " apple" * (CLIENT_NEW_TOKENS - 1), ["length"]), clients["chat stream"]
    assert clients["chat stream stop"] == ("apple", ["stop"]), clients["chat stream stop"]
    assert clients["generate stop"][1] == {"type": "stop", "matched": CLIENT_STOP}, clients["generate stop"]
    assert clients["chat n=2"][0] == clients["chat n=2"][1], clients["chat n=2"]
    return outs, clients


@pytest.fixture(scope="module")
def reference_outputs(target_only) -> dict[str, dict]:
    return target_only[0]


def test_chain_spec_equals_target_and_survives_bad_requests(
        reference_outputs, prompts, smollm2_dir, plugin_site, tmp_path):
    from eagle3_backend.cpu.launch import ServerSpec

    draft = make_random_draft(tmp_path / "random-draft", smollm2_dir)
    spec = ServerSpec(str(smollm2_dir), str(draft), num_steps=3, topk=1, num_draft_tokens=4)
    with _server(spec, plugin_site, tmp_path / "chain.log") as srv:
        outs = _run_all(srv, prompts)
        bad = {
            "bad json": srv.post("/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 4'),
            "negative max_new_tokens": srv.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}),
            "unknown sampling field": srv.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "bogus": 1}}),
            "not an object": srv.post("/generate", b"[1, 2]"),
            # These two stopped the whole server from the scheduler before the
            # plugin's request check (eagle3_backend/serving/requests.py).
            "empty prompt": srv.post("/generate", {"text": "", "sampling_params": {"max_new_tokens": 4}}),
            "out-of-vocabulary id": srv.post("/generate", {"input_ids": [1, 10**9], "sampling_params": {"max_new_tokens": 4}}),
            "top_logprobs_num > vocab": srv.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4},
                                                              "return_logprob": True, "top_logprobs_num": 10**5}),
            # SGLang leaves 8 tokens after it, the decode reserve: it came back empty, HTTP 200
            "no room for a decode step": srv.post("/generate", {"input_ids": [1] * 4086, "sampling_params": {
                "temperature": 0.0, "max_new_tokens": 12}}, timeout=REQUEST_TIMEOUT),
        }
        # Prompt + max_new_tokens past the 4096-token KV pool: SGLang clips max_new_tokens
        # for 1-token decode steps (14 here) and the EAGLE-3 verify reserve then aborted
        # the request with HTTP 500 and no output; the plugin clips with the reserve counted.
        near_pool = srv.post("/generate", {"input_ids": [1] * 4080, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}}, timeout=REQUEST_TIMEOUT)
        name, (ids, n) = next(iter(prompts.items()))
        after = srv.generate(ids, n, timeout=REQUEST_TIMEOUT)
    assert len(outs) == NUM_MTBENCH + len(REPEAT_PROMPTS)
    assert_same_tokens(outs, reference_outputs, "EAGLE-3 chain, random draft")
    for what, (status, body) in bad.items():
        assert 400 <= status < 500, f"{what}: HTTP {status} {str(body)[:200]}"
    assert "The prompt is empty" in str(bad["empty prompt"][1])
    assert "token id 1000000000 at position 1" in str(bad["out-of-vocabulary id"][1])
    assert "top_logprobs_num is 100000, larger than the model's vocabulary" in str(bad["top_logprobs_num > vocab"][1])
    assert ("the prompt (4086 tokens) leaves no room for an EAGLE-3 decode step in the 4096-token "
            "KV pool") in str(bad["no room for a decode step"][1])
    status, body = near_pool
    assert status == 200, f"request reaching the KV pool: HTTP {status} {str(body)[:300]}"
    assert body["meta_info"]["finish_reason"]["type"] == "length", body["meta_info"]
    assert len(body["output_ids"]) == 14 - 8, body["meta_info"]  # the clip minus the reserve
    assert after["output_ids"] == reference_outputs[name]["output_ids"], "server state changed after bad requests"
    lengths = [_accept_length(o) for o in outs.values()]
    assert all(1.0 <= a <= 4.0 for a in lengths), lengths


def test_second_draft_layout_after_restart_accepts(target_only, prompts, smollm2_dir, plugin_site, tmp_path):
    from eagle3_backend.cpu.launch import ServerSpec

    reference_outputs, reference_clients = target_only
    draft = make_echo_draft(tmp_path / "echo-draft", smollm2_dir)
    spec = ServerSpec(str(smollm2_dir), str(draft), num_steps=3, topk=1, num_draft_tokens=4)
    with _server(spec, plugin_site, tmp_path / "echo.log") as srv:
        outs = _run_all(srv, prompts, subset=True)
        clients = _client_requests(srv, prompts["repeat-0"][0])
        bench = _bench_level(srv, prompts)
        text = srv.log_text()
    assert_same_tokens(outs, reference_outputs, f"EAGLE-3 chain, echo draft {ECHO_LAYOUT}")
    # OpenAI clients (streaming, n > 1, logprobs, a stop string that cuts an accepted block)
    # see what they see from the target-only server
    _assert_same_client_view(clients, reference_clients, "EAGLE-3 chain, echo draft")
    assert f"EAGLE-3 layout {ECHO_LAYOUT} -> fc input 1728 (checked)" in text
    # eagle3 bench at concurrency 3: the two repeat prompts answered as when sent alone and
    # measured; the raw-text prompt finished in its prefill, listed apart, not averaged in
    s = bench.summary()
    assert [r.output_ids for r in bench.requests[:2]] == [outs[f"repeat-{i}"]["output_ids"] for i in range(2)]
    assert (s["n_ok"], s["n_spec_measured"]) == (3, 2), s
    assert s["no_spec_metrics"] == {"n": 1, "finished_in_prefill": [2], "decoded": [], "completion_tokens": 1,
                                    "finish_reasons": {"stop": 1}}, s
    measured = bench.requests[:2]
    assert s["acceptance_length"] == sum(r.completion_tokens for r in measured) / sum(r.spec_verify_ct for r in measured)
    # 3 drafts + 1 bonus per step while the target keeps repeating one token
    assert _accept_length(outs["repeat-0"]) > 2.5, outs["repeat-0"]["meta_info"]
    names = [f"repeat-{i}" for i in range(len(REPEAT_PROMPTS))]
    offline = offline_acceptance(smollm2_dir, draft, prompts, names, 3, 1, 4)
    for name in names:
        length, tokens = offline[name]
        assert tokens == outs[name]["output_ids"], f"{name}: offline verifier output differs from SGLang's"
        assert abs(length - _accept_length(outs[name])) <= 0.1, (name, length, _accept_length(outs[name]))


def test_tree_topk4_equals_target(reference_outputs, prompts, smollm2_dir, plugin_site, tmp_path):
    from eagle3_backend.cpu.launch import ServerSpec

    draft = make_echo_draft(tmp_path / "echo-draft", smollm2_dir)
    spec = ServerSpec(str(smollm2_dir), str(draft), num_steps=3, topk=4, num_draft_tokens=8)
    with _server(spec, plugin_site, tmp_path / "tree.log") as srv:
        outs = _run_all(srv, prompts, subset=True)
    assert_same_tokens(outs, reference_outputs, "EAGLE-3 tree topk 4, echo draft")
    assert _accept_length(outs["repeat-0"]) > 2.5, outs["repeat-0"]["meta_info"]
