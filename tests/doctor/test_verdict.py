"""The doctor's decision rule on synthetic paired scores: exact verdicts, bounds and looks."""

from __future__ import annotations

import math

import pytest
import torch

from eagle3_backend.doctor.verdict import (
    INCONCLUSIVE,
    MARGIN,
    MISMATCH,
    OK,
    WEAK,
    Z,
    Paired,
    decide,
    sequential,
)


def pair(n: int, better: int, worse: int, both: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(recorded, candidate) hits over n tokens: ``both`` right in both (default n // 2),
    ``better`` only in the candidate, ``worse`` only in the recorded one."""
    both = n // 2 if both is None else both
    rec, cand = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    rec[:both] = cand[:both] = True
    cand[both:both + better] = True
    rec[both + better:both + better + worse] = True
    return rec, cand


def test_constants_are_the_documented_ones():
    assert (MARGIN, Z) == (0.02, 3.0)


def test_paired_bounds_exact_values():
    p = Paired.of(*reversed(pair(100, 10, 0)))
    assert (p.n, p.better, p.worse) == (100, 10, 0)
    assert p.gap == pytest.approx(0.1) and p.se == pytest.approx(11 ** 0.5 / 100)
    assert p.lower == pytest.approx(0.1 - 3 * 11 ** 0.5 / 100)   # +0.0005: just clear
    assert p.z == pytest.approx(10 ** 0.5) and p.clearly_better and not p.ruled_out
    p = Paired(100, 12, 2)                  # the same gap, 14 tokens differ: not clear
    assert p.lower == pytest.approx(0.1 - 3 * 15 ** 0.5 / 100) and not p.clearly_better
    p = Paired(2000, 40, 30)                # +0.005, at most +0.0176: ruled out
    assert p.upper == pytest.approx(0.005 + 3 * 71 ** 0.5 / 2000) and p.ruled_out
    p = Paired(1000, 40, 30)                # +0.010, at most +0.035: open
    assert not p.ruled_out and not p.clearly_better
    assert p.tokens_to_settle() == pytest.approx(9 * 0.071 / 0.01 ** 2, abs=1)   # 6390
    assert Paired(0, 0, 0).se == math.inf and not Paired(0, 0, 0).ruled_out
    # a candidate scored on fewer tokens is compared on those only
    rec, cand = pair(200, 10, 0)
    assert Paired.of(cand[:100], rec) == Paired(100, 0, 0)


@pytest.mark.parametrize("n, better, worse, verdict, best, open_", [
    (100, 10, 0, MISMATCH, 1, (1,)),     # clearly better by 0.1
    (100, 12, 2, INCONCLUSIVE, 1, (1,)),  # +0.1 but not clear: the case (z 2.7)
    (2000, 40, 30, OK, 1, ()),           # ahead, but by less than MARGIN for sure
    (1000, 40, 30, INCONCLUSIVE, 1, (1,)),
    (100, 0, 10, OK, 0, ()),             # worse for sure: the recorded layout fits best
    (100, 0, 0, INCONCLUSIVE, 0, (1,)),  # identical on 100 tokens: too few to rule out 0.02
    (1000, 0, 0, OK, 0, ()),             # ... 1000 are enough
])
def test_decide_one_candidate(n, better, worse, verdict, best, open_):
    rec, cand = pair(n, better, worse)
    d = decide([rec, cand])
    assert (d.verdict, d.best, d.open) == (verdict, best, open_)
    assert d.paired[0] is None and d.paired[1] == Paired(n, better, worse)


def test_weak_when_every_layout_predicts_poorly():
    rec, cand = pair(100, 3, 0, both=5)      # top-1 0.05 and 0.08
    assert decide([rec, cand]).verdict == WEAK
    rec, cand = pair(100, 6, 0, both=5)      # 0.11: the layout may matter
    assert decide([rec, cand]).verdict == INCONCLUSIVE


def test_the_named_layout_is_proposed_first_and_ok_needs_every_candidate_ruled_out():
    n = 1000
    rec = torch.zeros(n, dtype=torch.bool)
    rec[:500] = True
    a = rec.clone()
    a[500:550] = True                        # proposed: +0.05, clearly better
    near = a.clone()
    near[550:555] = True                     # only tried: +0.055, but not clearly above a
    far = a.clone()
    far[550:610] = True                      # only tried: +0.11, clearly above a
    d = decide([rec, a, near], [True, True, False])
    assert (d.verdict, d.best) == (MISMATCH, 1)
    d = decide([rec, a, near, far], [True, True, False, False])
    assert (d.verdict, d.best) == (MISMATCH, 3)
    # all proposed: the first one that the leader does not clearly beat
    assert decide([rec, a, near], None).best == 1
    assert decide([rec, a, far], None).best == 2
    assert decide([rec, near, a], None).best == 1           # near first: it is named
    # every proposed layout ruled out, one only tried still open: not OK
    rec, ruled = pair(2000, 40, 30)
    _, open_ = pair(2000, 60, 30)            # +0.015, at most +0.029; clear of 0 but < MARGIN
    d = decide([rec, ruled, open_], [True, True, False])
    assert (d.verdict, d.best, d.open) == (INCONCLUSIVE, 1, (2,))


def _looks(blocks, calls):
    """Looks returning, per block, the hits of the layouts asked for (recorded, good, bad)."""
    for block in blocks:
        def look(which, block=block):
            calls.append(which)
            return None if block is None else [block[i] for i in which]
        yield look


def _block(n, better, worse):
    rec, good = pair(n, better, worse)
    bad = rec.clone()
    bad[:30] = False                         # 30 tokens worse than the recorded layout
    return rec, good, bad


def test_sequential_scores_more_tokens_until_settled():
    calls = []
    blocks = [None, _block(100, 8, 1), _block(200, 16, 4), _block(400, 0, 0)]
    hits, decisions = sequential(_block(100, 8, 3), _looks(blocks, calls))
    # look 1: +0.05 over 100 tokens (at least -0.054); the bad layout ruled out at once
    # (gap -0.3); look 2 adds no tokens; look 3: +0.06 over 200 (at least -0.009);
    # look 4: +0.06 over 400 (at least +0.012): MISMATCH, and the last block is never asked for
    assert [d.verdict for d in decisions] == [INCONCLUSIVE, INCONCLUSIVE, MISMATCH]
    assert [d.paired[1] for d in decisions] == [Paired(100, 8, 3), Paired(200, 16, 4),
                                                Paired(400, 32, 8)]
    assert decisions[0].paired[2] == Paired(100, 0, 30) and decisions[0].open == (1,)
    assert calls == [(0, 1), (0, 1), (0, 1)]
    assert [h.numel() for h in hits] == [400, 400, 100]   # the bad layout: look 1 only
    assert decisions[-1].paired[1].lower == pytest.approx(0.06 - 3 * 41 ** 0.5 / 400)


def test_sequential_stops_at_the_budget_undecided_or_at_once_when_settled():
    calls = []
    hits, decisions = sequential(_block(100, 8, 3), _looks([_block(100, 8, 1)], calls))
    assert [d.verdict for d in decisions] == [INCONCLUSIVE, INCONCLUSIVE]   # budget spent
    assert decisions[-1].tokens_to_settle == Paired(200, 16, 4).tokens_to_settle() > 200
    calls = []
    _, decisions = sequential(_block(100, 0, 40), _looks([_block(100, 8, 1)], calls))
    assert [d.verdict for d in decisions] == [OK] and calls == []
