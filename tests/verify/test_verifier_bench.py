"""The live-server client against a real local HTTP server speaking SGLang's JSON
(``sglang_peer.py``; fixture ``serve``), including slow answers, bad JSON, HTTP 500
and a closed port."""

from __future__ import annotations

import asyncio
import time

import pytest
from sglang_peer import tokens_for

from eagle3_backend.cpu.launch import free_port
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.verify.bench import BenchSettings, run_benchmark, run_level


PROMPTS = [f"prompt number {i}" + "!" * i for i in range(8)]


def test_native_level_reads_meta_info_and_limits_concurrency(serve):
    srv = serve(delay=0.05)
    level = asyncio.run(run_level(srv.url, PROMPTS, 4, BenchSettings(max_new_tokens=32)))
    s = level.summary()
    expect = [tokens_for(p) for p in PROMPTS]
    assert s["n_ok"] == 8 and s["n_errors"] == 0
    assert s["completion_tokens"] == sum(n for n, _ in expect)
    assert s["spec_verify_ct"] == sum(v for _, v in expect)
    assert s["acceptance_length"] == pytest.approx(sum(n for n, _ in expect) / sum(v for _, v in expect))
    assert s["acceptance_histogram"] == [8, sum(v - 1 for _, v in expect)]
    assert s["server_avg_spec_accept_length"] == 1.75
    assert s["output_tokens_per_s"] == pytest.approx(s["completion_tokens"] / level.wall_s)
    assert 1 < srv.max_inflight <= 4
    path, body = srv.bodies[0]
    assert path == "/generate"
    assert body["sampling_params"] == {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": False}
    assert {b["text"] for _, b in srv.bodies} == set(PROMPTS)
    assert [r.output_ids for r in level.requests] == [list(range(n)) for n, _ in expect]


def test_concurrency_one_is_sequential(serve):
    srv = serve()
    asyncio.run(run_level(srv.url, PROMPTS[:4], 1, BenchSettings()))
    assert srv.max_inflight == 1


def test_openai_api(serve):
    srv = serve()
    chats = [[{"role": "user", "content": p}] for p in PROMPTS[:3]]
    level = asyncio.run(run_level(srv.url, chats, 2, BenchSettings(api="openai", model="m")))
    s = level.summary()
    assert s["n_ok"] == 3
    assert s["spec_verify_ct"] == sum(tokens_for(p)[1] for p in PROMPTS[:3])
    path, body = srv.bodies[0]
    assert path == "/v1/chat/completions"
    assert body["return_spec_tokens_details"] is True and body["model"] == "m"
    assert level.requests[0].spec_histogram == [0, tokens_for(PROMPTS[0])[1]]


@pytest.mark.parametrize("mode,kind", [("bad-json", "bad-response"), ("500", "http"),
                                       ("bad-ids", "bad-response")])
def test_bad_responses_are_reported_per_request(serve, mode, kind):
    srv = serve(mode=mode)
    level = asyncio.run(run_level(srv.url, PROMPTS[:3], 2, BenchSettings()))
    assert [r.ok for r in level.requests] == [False] * 3
    assert all(r.error.startswith(f"{kind}:") for r in level.requests)
    assert level.summary()["errors_by_kind"] == {kind: 3}


def test_timeout_never_hangs(serve):
    srv = serve(delay=3.0)
    t0 = time.perf_counter()
    level = asyncio.run(run_level(srv.url, PROMPTS[:2], 2, BenchSettings(timeout_s=0.4)))
    assert time.perf_counter() - t0 < 2.5
    assert all(not r.ok and r.error.startswith("timeout:") for r in level.requests)


def test_connection_refused_is_reported(serve):
    url = f"http://127.0.0.1:{free_port()}"
    level = asyncio.run(run_level(url, PROMPTS[:2], 2, BenchSettings(timeout_s=5)))
    assert all(not r.ok and r.error.startswith("connection:") for r in level.requests)
    assert level.server_info_error is not None
    assert level.summary()["output_tokens_per_s"] == 0.0


def test_benchmark_spec_vs_baseline(serve):
    spec = serve(delay=0.01)
    base = serve(spec=False, delay=0.03)
    out = run_benchmark(spec.url, PROMPTS[:4], [1, 2], BenchSettings(max_new_tokens=8),
                        baseline_url=base.url, warmup=1)
    assert out["errors"] == []
    assert out["servers"]["spec"]["server_info"]["speculative_algorithm"] == "EAGLE3"
    assert out["servers"]["spec"]["server_info"]["avg_spec_accept_length"] == 1.75
    assert out["servers"]["baseline"]["server_info"]["avg_spec_accept_length"] is None
    assert [lv["concurrency"] for lv in out["levels"]] == [1, 2]
    for lv in out["levels"]:
        assert lv["baseline"]["acceptance_length"] is None
        assert lv["speedup"] == pytest.approx(
            lv["spec"]["output_tokens_per_s"] / lv["baseline"]["output_tokens_per_s"])
    # warm-up request + 2 levels x 4 prompts per server
    assert len(spec.bodies) == len(base.bodies) == 9
    assert len(out["requests"]["spec"]["2"]) == 4


def test_benchmark_reports_acceptance_by_category_of_the_spec_server(serve):
    spec, base = serve(delay=0.0), serve(spec=False, delay=0.0)
    cats = ["coding", "writing", "coding", None]
    out = run_benchmark(spec.url, PROMPTS[:4], [2], BenchSettings(), baseline_url=base.url,
                        warmup=0, categories=cats)
    counts = [tokens_for(p) for p in PROMPTS[:4]]
    want = {name: {"prompts": len(ix), "acceptance_length": sum(counts[i][0] for i in ix)
                   / sum(counts[i][1] for i in ix)} for name, ix in (("coding", [0, 2]), ("writing", [1]))}
    assert out["levels"][0]["spec"]["acceptance_by_category"] == want
    assert "acceptance_by_category" not in out["levels"][0]["baseline"]
    plain = run_benchmark(spec.url, PROMPTS[:2], [1], BenchSettings(), warmup=0)
    assert "acceptance_by_category" not in plain["levels"][0]["spec"]


def test_benchmark_with_dead_baseline_reports_errors(serve):
    spec = serve()
    dead = f"http://127.0.0.1:{free_port()}"
    out = run_benchmark(spec.url, PROMPTS[:2], [1], BenchSettings(timeout_s=5), baseline_url=dead,
                        warmup=0)
    assert out["levels"][0]["speedup"] is None
    assert {e["server"] for e in out["errors"]} == {"baseline"}
    assert len(out["errors"]) == 2
    assert "server_info_error" in out["servers"]["baseline"]


def test_settings_validation():
    with pytest.raises(Eagle3Error, match="--api"):
        BenchSettings(api="grpc")
    with pytest.raises(Eagle3Error, match="--timeout"):
        BenchSettings(timeout_s=0)


def _native(n: int, verify: int | None, finish: str = "length") -> dict:
    """A /generate answer as SGLang 0.5.23 builds it: no spec_* keys without a verify step."""
    meta = {"prompt_tokens": 5, "completion_tokens": n,
            "finish_reason": {"type": finish, **({"matched": 2} if finish == "stop" else {"length": n})}}
    if verify:
        meta |= {"spec_accept_length": n / verify, "spec_verify_ct": verify,
                 "spec_correct_drafts_histogram": [verify - 1, 1]}
    return {"text": "x", "output_ids": list(range(n)), "meta_info": meta}


def test_answers_without_spec_metrics_are_counted_not_averaged():
    """The issue-16 run: raw MT-Bench text, SmolLM2 answers some prompts with end of sequence
    at once (1 token, finished in the prefill: SGLang sends no spec_* field); one constructed
    answer decodes 9 tokens with no verify step counted."""
    from eagle3_backend.verify.bench import LevelResult, RequestResult, _parse_response
    from eagle3_backend.verify.cli import no_spec_lines

    answers = [_native(48, 40), _native(1, None, "stop"), _native(30, 24, "stop"),
               _native(1, None, "stop"), _native(9, None)]
    reqs = [RequestResult(i, True, 0.5, **_parse_response("native", a)) for i, a in enumerate(answers)]
    reqs.append(RequestResult(5, False, 0.1, "timeout: no complete response within 1s"))
    assert [r.finish_reason for r in reqs] == ["length", "stop", "stop", "stop", "length", None]
    s = LevelResult(8, 2.0, reqs).summary()
    assert s["acceptance_length"] == pytest.approx((48 + 30) / (40 + 24))  # the measured two only
    assert s["completion_tokens"] == 48 + 1 + 30 + 1 + 9                    # tok/s counts every token
    assert (s["n_ok"], s["n_spec_measured"], s["spec_verify_ct"]) == (5, 2, 64)
    assert s["no_spec_metrics"] == {"n": 3, "finished_in_prefill": [1, 3], "decoded": [4],
                                    "completion_tokens": 11, "finish_reasons": {"stop": 2, "length": 1}}
    assert LevelResult(8, 2.0, reqs).summary(speculative=False)["no_spec_metrics"] is None
    result = {"levels": [{"concurrency": 8, "spec": s},
                         {"concurrency": 1, "spec": LevelResult(1, 1.0, reqs[:1]).summary()}]}
    assert no_spec_lines(result, raw_text=True) == [
        "c=8: 3 of 5 answers carry no speculative metrics (SGLang counted no verify step), left out "
        "of the acceptance length, which is over the other 2: 2 finished in the prefill with at most "
        "one token, nothing to speculate (requests 1, 3), e.g. an immediate end of sequence on raw "
        "text without a chat template: pass --tokenizer TARGET; 1 decoded more tokens with no verify "
        "step counted, not speculated or the metric lost (requests 4)"]
    # OpenAI answers: finish_reason from the choice, no sglext without a verify step
    fields = _parse_response("openai", {"choices": [{"finish_reason": "stop", "message": {}}],
                                        "usage": {"completion_tokens": 1, "prompt_tokens": 5}})
    assert (fields["finish_reason"], fields["spec_verify_ct"], fields["spec_accept_length"]) == ("stop", None, None)


def test_benchmark_lists_unmeasured_answers_of_the_spec_server_only(serve):
    spec, base = serve(one_token=" 2!!"), serve(spec=False)
    out = run_benchmark(spec.url, PROMPTS[:4], [2], BenchSettings(), baseline_url=base.url, warmup=0)
    lv = out["levels"][0]
    # PROMPTS[2] ends in " 2!!": the peer answers it with one token and no spec metrics
    assert lv["spec"]["no_spec_metrics"] == {"n": 1, "finished_in_prefill": [2], "decoded": [],
                                             "completion_tokens": 1, "finish_reasons": {"stop": 1}}
    assert lv["spec"]["n_spec_measured"] == 3
    assert lv["baseline"]["no_spec_metrics"] is None
    assert [r["finish_reason"] for r in out["requests"]["spec"]["2"]] == ["length", "length", "stop", "length"]
