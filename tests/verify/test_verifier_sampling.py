"""Rejection sampling keeps the target distribution: chi-square tests on a small vocabulary.

Each test draws a fixed-seed sample and compares the empirical law of the committed
tokens with the target's; the critical values are the chi-square 0.999 quantiles, and a
deliberately wrong sampler is shown to fail the same check (the test has power).
"""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.verify.sampling import (
    chain_speculative_sampling,
    chain_speculative_sampling_torch,
    probs_from_logits,
    sample_from_probs,
    tree_speculative_sampling,
)

# chi-square 0.999 quantiles by degrees of freedom (scipy.stats.chi2.ppf(0.999, df))
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson statistic of counts [V] against probs [V] (cells with p = 0 must be empty)."""
    n = counts.sum().item()
    expected = probs.double() * n
    zero = expected == 0
    assert counts[zero].sum() == 0, f"tokens drawn where the target has probability 0: {counts}"
    return float((((counts.double() - expected) ** 2)[~zero] / expected[~zero]).sum())


def assert_law(counts: torch.Tensor, probs: torch.Tensor) -> None:
    df = int((probs > 0).sum()) - 1
    stat = chi_square(counts, probs)
    assert stat < CHI2_999[df], (
        f"chi2 {stat:.1f} >= {CHI2_999[df]} (df {df}): counts {counts.tolist()} vs "
        f"expected {(probs * counts.sum()).tolist()}")


def _dist(seed: int, V: int, zero: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g) + 0.05
    if zero is not None:
        p[zero] = 0
    return p / p.sum()


def test_chain_first_and_second_token_follow_target():
    V, S, N = 6, 2, 20000
    p = torch.stack([_dist(1, V), _dist(2, V), _dist(3, V)])   # target after root, d1, d2
    q = torch.stack([_dist(4, V), _dist(5, V)])                 # draft laws
    gen = torch.Generator().manual_seed(0)
    drafts = torch.stack([sample_from_probs(q[i].expand(N, V), gen) for i in range(S)], dim=1)
    out, emitted = chain_speculative_sampling_torch(q.expand(N, S, V), drafts, p.expand(N, S + 1, V), gen)
    assert out.shape == (N, S + 1)
    # exactly emitted + 1 tokens, -1 after them
    valid = out >= 0
    assert torch.equal(valid.sum(1), emitted + 1)
    assert torch.equal(valid, torch.arange(S + 1)[None] <= emitted[:, None])
    # accepted tokens are the drafts
    for i in range(S):
        acc = emitted > i
        assert torch.equal(out[acc, i], drafts[acc, i])
    assert_law(torch.bincount(out[:, 0], minlength=V), p[0])
    # given the first token was the accepted draft, the second follows p[1]
    second = out[(emitted >= 1), 1]
    assert_law(torch.bincount(second, minlength=V), p[1])
    # acceptance rate at position 1 is sum_x min(p, q)
    expected_accept = torch.minimum(p[0], q[0]).sum().item()
    assert abs((emitted >= 1).float().mean().item() - expected_accept) < 0.02


def test_chain_one_hot_drafts_and_zero_probability_tokens():
    V, N = 5, 20000
    p = torch.stack([_dist(7, V, zero=3), _dist(8, V)])
    drafts = torch.full((N, 1), 3)                                # target gives it probability 0
    q = torch.nn.functional.one_hot(drafts, V).float()
    gen = torch.Generator().manual_seed(1)
    out, emitted = chain_speculative_sampling_torch(q, drafts, p.expand(N, 2, V), gen)
    assert emitted.sum() == 0
    assert_law(torch.bincount(out[:, 0], minlength=V), p[0])


def test_chain_detects_a_wrong_sampler():
    """Power check: accepting every draft token (ignoring p/q) fails the same test."""
    V, N = 6, 20000
    p = _dist(1, V)
    q = _dist(4, V)
    gen = torch.Generator().manual_seed(0)
    drafts = sample_from_probs(q.expand(N, V), gen)
    wrong = torch.bincount(drafts, minlength=V)                   # law q, not p
    assert chi_square(wrong, p) > CHI2_999[V - 1]


def _tree_case():
    #   root(0): children a=1 (token 2), b=2 (token 4); a has child c=3 (token 0)
    V = 6
    probs = torch.stack([_dist(11, V), _dist(12, V), _dist(13, V), _dist(14, V)])
    candidates = [9, 2, 4, 0]
    first_child = [1, 3, -1, -1]
    next_sibling = [-1, 2, -1, -1]
    return V, probs, candidates, first_child, next_sibling


def test_tree_sampling_follows_target():
    V, probs, cand, first, nxt = _tree_case()
    gen = torch.Generator().manual_seed(2)
    first_tok, after_a, after_b = [], [], []
    paths = {}
    N = 6000
    for _ in range(N):
        acc, tok = tree_speculative_sampling(probs, cand, first, nxt, gen)
        committed = [cand[i] for i in acc[1:]] + [tok]
        paths[tuple(acc)] = paths.get(tuple(acc), 0) + 1
        first_tok.append(committed[0])
        if acc[1:2] == [1]:
            after_a.append(committed[1])
        if acc[1:2] == [2]:
            after_b.append(committed[1])
    assert set(paths) <= {(0,), (0, 1), (0, 1, 3), (0, 2)}
    assert_law(torch.bincount(torch.tensor(first_tok), minlength=V), probs[0])
    assert_law(torch.bincount(torch.tensor(after_a), minlength=V), probs[1])
    assert_law(torch.bincount(torch.tensor(after_b), minlength=V), probs[2])
    # sibling b is tried only after a is rejected: P(accept b) = p(4)
    share_b = paths.get((0, 2), 0) / N
    assert abs(share_b - probs[0, 4].item()) < 0.03


def test_tree_sampling_is_greedy_on_one_hot_targets():
    V, probs, cand, first, nxt = _tree_case()
    onehot = torch.zeros(4, V)
    onehot[0, 2] = 1   # root -> token 2 = node a
    onehot[1, 0] = 1   # a -> token 0 = node c
    onehot[3, 5] = 1   # c -> 5 (bonus)
    onehot[2, 1] = 1
    acc, tok = tree_speculative_sampling(onehot, cand, first, nxt, torch.Generator().manual_seed(0))
    assert (acc, tok) == ([0, 1, 3], 5)


def test_probs_from_logits_and_backend_choice():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    torch.testing.assert_close(probs_from_logits(logits, 0.5), torch.softmax(logits * 2, -1))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        probs_from_logits(logits, 0.0)
    with pytest.raises(ValueError, match="backend"):
        chain_speculative_sampling(torch.ones(1, 1, 3) / 3, torch.zeros(1, 1, dtype=torch.long),
                                   torch.ones(1, 2, 3) / 3, backend="cuda")


@pytest.mark.gpu
def test_flashinfer_chain_matches_target_law():
    V, S, N = 6, 2, 20000
    dev = "cuda"
    p = torch.stack([_dist(1, V), _dist(2, V), _dist(3, V)]).to(dev)
    q = torch.stack([_dist(4, V), _dist(5, V)]).to(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    drafts = torch.stack([sample_from_probs(q[i].expand(N, V), gen) for i in range(S)], dim=1)
    out, emitted = chain_speculative_sampling(q.expand(N, S, V).contiguous(), drafts,
                                              p.expand(N, S + 1, V).contiguous(), gen,
                                              backend="flashinfer")
    out, emitted = out.cpu(), emitted.cpu()
    assert torch.equal((out >= 0).sum(1), emitted + 1)
    assert_law(torch.bincount(out[:, 0], minlength=V), p[0].cpu())
    assert_law(torch.bincount(out[emitted >= 1, 1], minlength=V), p[1].cpu())
