"""Metrics as SGLang defines them, on hand-computed cases."""

from __future__ import annotations

import pytest

from eagle3_backend.verify.metrics import (
    step_breakdown,
    acceptance_by_category,
    acceptance_histogram,
    acceptance_length,
    acceptance_rate_by_position,
    summarize,
)


def test_acceptance_by_category_pools_tokens_over_steps_per_name():
    rows = [("writing", 10, 5), ("coding", 9, 3), ("writing", 6, 3), (None, 100, 1), ("", 7, 7)]
    assert acceptance_by_category(rows) == {"coding": {"prompts": 1, "acceptance_length": 3.0},
                                            "writing": {"prompts": 2, "acceptance_length": 2.0}}
    assert list(acceptance_by_category(rows)) == ["coding", "writing"]
    assert acceptance_by_category([(None, 4, 2)]) is None
    assert acceptance_by_category([("math", 1, 0)]) == {"math": {"prompts": 1, "acceptance_length": None}}


def test_acceptance_length_is_tokens_over_verify_steps():
    assert acceptance_length(10, 4) == 2.5
    assert acceptance_length(5, 0) is None
    with pytest.raises(ValueError):
        acceptance_length(-1, 2)


def test_histogram_and_rates():
    steps = [0, 3, 1, 3, 2, 0]
    assert acceptance_histogram(steps, 3) == [2, 1, 1, 2]
    # >=1: 4/6, >=2: 3/6, >=3: 2/6
    assert acceptance_rate_by_position(steps, 3) == [4 / 6, 3 / 6, 2 / 6]
    assert acceptance_rate_by_position([], 2) == [None, None]
    with pytest.raises(ValueError, match="expected 0..3"):
        acceptance_histogram([4], 3)


def test_summarize_two_requests():
    # request A: first token from prefill + steps accepting 2,0 -> 1 + 3 + 1 = 5 tokens
    # request B: 1 + (1+1) + (3+1) = 7 tokens
    m = summarize([5, 7], [1.0, 2.0], [[2, 0], [1, 3]], 3, baseline_tokens=[5, 7],
                  baseline_seconds=[2.0, 4.0])
    assert m.n_prompts == 2
    assert m.completion_tokens == 12
    assert m.verify_steps == 4
    assert m.acceptance_length == 3.0
    assert m.acceptance_histogram == [1, 1, 1, 1]
    assert m.acceptance_rate_by_position == [0.75, 0.5, 0.25]
    assert m.tokens_per_s == 4.0
    assert m.baseline_tokens_per_s == 2.0
    assert m.speedup == 2.0
    d = m.to_dict()
    assert d["speedup"] == 2.0 and d["acceptance_histogram"] == [1, 1, 1, 1]
    no_base = summarize([3], [1.0], [[1]], 2)
    assert no_base.baseline_tokens_per_s is None and no_base.speedup is None


def test_step_breakdown_averages_phases_over_steps_and_decodes():
    # two requests: 3 + 1 verify steps; target-only 5 + 2 tokens = 4 + 1 decode forwards
    spec = [{"prefill": 0.5, "draft": 0.03, "verify": 0.09, "accept": 0.006},
            {"prefill": 0.25, "draft": 0.01, "verify": 0.03, "accept": 0.002}]
    base = [{"prefill": 0.25, "decode": 0.1}, {"prefill": 0.25, "decode": 0.025}]
    ms = step_breakdown(spec, 4, base, [5, 2])
    assert ms["draft"] == pytest.approx(10.0) and ms["verify"] == pytest.approx(30.0)
    assert ms["accept"] == pytest.approx(2.0) and ms["step"] == pytest.approx(42.0)
    assert ms["prefill"] == pytest.approx(375.0) and ms["baseline_prefill"] == pytest.approx(250.0)
    assert ms["decode"] == pytest.approx(25.0) and ms["step_cost"] == pytest.approx(1.68)
    alone = step_breakdown(spec, 4)
    assert "step_cost" not in alone and alone["step"] == pytest.approx(42.0)
    nothing = step_breakdown([{"prefill": 0.1}], 0, [{"prefill": 0.1, "decode": 0.0}], [1])
    assert nothing["step"] is None and nothing["decode"] is None and nothing["step_cost"] is None
