"""`eagle3 doctor --url`: the served-vs-offline statistics, verdicts and server checks.

End to end against a real SGLang server: tests/cpu/test_cpu_doctor_serve.py.
"""

from __future__ import annotations

import math

import pytest

from eagle3_backend.cpu.launch import free_port
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.doctor.serve import (
    PromptResult,
    ServeReport,
    judge_serve,
    paired_t,
    server_settings,
)
from eagle3_backend.doctor.verdict import MISMATCH, OK, WEAK

URL = "http://127.0.0.1:30000"


def test_paired_t_exact_values():
    # d = [-1.0, -0.8, -0.6]: mean -0.8, sd 0.2, se 0.2 / sqrt(3)
    assert paired_t([1.0, 1.2, 1.4], [2.0, 2.0, 2.0]) == pytest.approx(-0.8 / (0.2 / 3 ** 0.5))
    assert paired_t([2.0, 2.5], [2.0, 2.5]) == 0.0
    assert paired_t([1.5, 1.5], [2.0, 2.0]) == -math.inf
    assert paired_t([2.5, 2.5], [2.0, 2.0]) == math.inf
    assert math.isnan(paired_t([2.0], [1.0]))
    with pytest.raises(ValueError, match="2 served and 1 offline"):
        paired_t([1.0, 2.0], [1.0])


def _prompts(offline: list[tuple[int, int]], served: list[tuple[int, int]]) -> list[PromptResult]:
    return [PromptResult(f"p{i}", 10, ot, os_, st, ss, None)
            for i, ((ot, os_), (st, ss)) in enumerate(zip(offline, served))]


def test_same_counts_are_ok():
    rows = [(32, 16), (30, 12), (32, 14), (28, 14)]
    verdict, message, t = judge_serve(_prompts(rows, rows))
    assert verdict == OK and t == 0.0
    assert message.startswith("served acceptance length 2.18, offline 2.18 with the server's "
                              "settings on the same 4 prompts (paired t = 0.0)")


def test_a_server_that_loses_the_gain_is_a_mismatch():
    offline = [(32, 16), (30, 12), (32, 14), (28, 14)]          # 122 / 56 = 2.18
    served = [(32, 28), (30, 24), (32, 26), (28, 25)]           # 122 / 103 = 1.18: (2.18 - 1.18) / 1.18 = 84% of the gain lost
    verdict, message, t = judge_serve(_prompts(offline, served), "/models/other-draft")
    assert verdict == MISMATCH and t < -3
    assert "the server loses 84% of the speculative gain" in message
    assert "that it serves this draft (the server's draft: /models/other-draft)" in message
    assert "SGLANG_PLUGINS" in message


def test_a_server_that_accepts_more_serves_something_else():
    offline = [(32, 28), (30, 24), (32, 26), (28, 25)]
    served = [(32, 16), (30, 12), (32, 14), (28, 14)]
    verdict, message, t = judge_serve(_prompts(offline, served))
    assert verdict == MISMATCH and t > 3
    assert "the server accepts more than this draft can" in message
    assert "Pass the served draft as DRAFT" in message


def test_small_or_noisy_differences_are_ok():
    offline = [(32, 16), (30, 12), (32, 14), (28, 14)]
    # 10% less gain: under REL_GAP whatever t says
    served = [(32, 17), (30, 13), (32, 15), (28, 15)]
    assert judge_serve(_prompts(offline, served))[0] == OK
    # a large gap on one prompt only: t = -1 (mean -0.25, se 0.25), no evidence
    served = [(32, 32), (30, 12), (32, 14), (28, 14)]
    verdict, _, t = judge_serve(_prompts(offline, served))
    assert verdict == OK and t == pytest.approx(-1.0)


def test_a_draft_that_gains_nothing_offline_is_weak():
    rows = [(32, 31), (30, 29)]
    verdict, message, _ = judge_serve(_prompts(rows, [(32, 32), (30, 30)]))
    assert verdict == WEAK
    assert "offline the draft gains only 0.03 tokens per verify step" in message


def test_server_settings_are_read_and_checked():
    info = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    assert server_settings(info, URL) == {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                          "speculative_num_draft_tokens": 4}
    with pytest.raises(Eagle3Error, match=r"runs speculative_algorithm=None, not EAGLE3: there is no draft"):
        server_settings({"speculative_algorithm": None}, URL)
    with pytest.raises(Eagle3Error, match=r"reports speculative_eagle_topk=None in /server_info"):
        server_settings({**info, "speculative_eagle_topk": None}, URL)


def test_the_json_report_is_strict_json():
    import json

    rows = _prompts([(32, 16)] * 3, [(32, 20)] * 3)   # every difference the same: t = -inf
    verdict, message, t = judge_serve(rows)
    assert t == -math.inf
    report = ServeReport(URL, "draft", {}, {}, rows, verdict, message, t)
    assert json.loads(json.dumps(report.as_dict(), allow_nan=False))["paired_t"] == "-inf"
    report.t = math.nan
    assert report.as_dict()["paired_t"] is None


def _mtbench(n: int):
    from eagle3_backend.verify.datasets import read_mtbench

    return read_mtbench(limit=n)


def test_check_server_refuses_bad_input_before_any_generation(smollm2, serve, tmp_path):
    from eagle3_backend.doctor.serve import MIN_PROMPTS, check_server

    draft = tmp_path / "never-read"
    with pytest.raises(Eagle3Error, match=rf"^2 of the 2 prompts .* needs at least {MIN_PROMPTS}"):
        check_server(URL, draft, smollm2, _mtbench(2))
    closed = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on
    with pytest.raises(Eagle3Error, match=rf"cannot read /server_info from {closed}: .* Is an SGLang server"):
        check_server(closed, draft, smollm2, _mtbench(MIN_PROMPTS))
    srv = serve(spec=False)             # a target-only server: nothing to compare
    with pytest.raises(Eagle3Error, match=r"runs speculative_algorithm=None, not EAGLE3"):
        check_server(srv.url, draft, smollm2, _mtbench(MIN_PROMPTS))
    srv = serve()                       # EAGLE3, but /server_info lacks the top-k and draft tokens
    with pytest.raises(Eagle3Error, match=r"reports speculative_eagle_topk=None in /server_info"):
        check_server(srv.url, draft, smollm2, _mtbench(MIN_PROMPTS))
    assert srv.bodies == []             # nothing was generated


def test_answers_finished_in_the_prefill_are_left_out():
    from eagle3_backend.doctor.serve import drop_prefill_answers
    from eagle3_backend.verify.bench import RequestResult

    encoded = [("a", [1, 2]), ("b", [3]), ("c", [4, 5, 6])]
    served = [RequestResult(0, True, 0.1, completion_tokens=5, spec_verify_ct=3, output_ids=[7, 8, 9, 10, 11]),
              RequestResult(1, True, 0.1, completion_tokens=1, output_ids=[2]),   # EOS at once
              RequestResult(2, True, 0.1, completion_tokens=2, spec_verify_ct=1, output_ids=[5, 6])]
    kept, answers, dropped = drop_prefill_answers(encoded, served)
    assert kept == [encoded[0], encoded[2]] and answers == [served[0], served[2]] and dropped == ["b"]
