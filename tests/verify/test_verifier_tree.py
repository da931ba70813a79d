"""Speculative settings and EAGLE chain / top-k tree drafting against brute-force references."""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.model import propose_chain
from eagle3_backend.verify.tree import DraftTree, SpecSettings, draft_tree

LAYOUT = "[embed, layer_input:2]"
HT, VOCAB = 64, 512


def test_settings_defaults_and_validation():
    assert SpecSettings(3, 1).speculative_num_draft_tokens == 4
    assert SpecSettings(3, 4).speculative_num_draft_tokens == 8
    assert SpecSettings(2, 2).speculative_num_draft_tokens == 7  # 1 + 2 + 1*4 = 7 < 8
    assert SpecSettings(5, 8, 64).to_dict() == {
        "speculative_num_steps": 5, "speculative_eagle_topk": 8, "speculative_num_draft_tokens": 64}
    with pytest.raises(Eagle3Error, match="verifies exactly 4 tokens"):
        SpecSettings(3, 1, 6)
    with pytest.raises(Eagle3Error, match="expected 2..7"):
        SpecSettings(2, 2, 8)
    with pytest.raises(Eagle3Error, match="integer >= 1"):
        SpecSettings(0, 1)
    with pytest.raises(Eagle3Error, match="integer >= 1"):
        SpecSettings(2, True)


def test_draft_tree_links():
    #        0
    #      1   2
    #     3 4   5
    tree = DraftTree.from_parents(torch.arange(6) + 10, [-1, 0, 0, 1, 1, 2])
    assert tree.depths == (0, 1, 1, 2, 2, 2)
    assert tree.first_child == (1, 3, 5, -1, -1, -1)
    assert tree.next_sibling == (-1, 2, -1, 4, -1, -1)
    assert tree.path(4) == [0, 1, 4]
    mask = tree.attention_mask(prefix_len=2)
    assert mask.shape == (6, 8)
    assert mask[4].tolist() == [True, True, True, True, False, False, True, False]
    with pytest.raises(Eagle3Error, match="parent"):
        DraftTree.from_parents(torch.arange(3), [-1, 2, 0])


def _inputs(seed: int, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, T), generator=g)
    hidden = torch.randn(1, T, 2 * HT, generator=g) * 3
    return ids, hidden


@torch.no_grad()
def test_chain_matches_propose_chain(make_tiny_draft):
    draft = make_tiny_draft(HT, VOCAB, LAYOUT, draft_vocab=128, seed=3)
    ids, hidden = _inputs(1)
    settings = SpecSettings(4, 1)
    cache = draft.new_cache(1, 64)
    tree = draft_tree(draft, settings, int(ids[0, -1]), ids, hidden, cache)
    ref = propose_chain(draft, ids, hidden, None, draft.new_cache(1, 64), 4)
    assert tree.parents == (-1, 0, 1, 2, 3)
    assert tree.tokens[0] == ids[0, -1]
    assert tree.tokens[1:].tolist() == ref[0].tolist()
    assert cache.length == ids.shape[1]  # drafted nodes dropped, extension kept


@torch.no_grad()
def _reference_tree(draft, settings: SpecSettings, root: int, ids, hidden):
    """Brute force: every frontier node is expanded with its own cache copy and a plain
    causal forward (no tree mask), then the best nodes are taken by cumulative log-prob."""
    k, steps = settings.speculative_eagle_topk, settings.speculative_num_steps
    cache = draft.new_cache(1, 128)
    T = ids.shape[1]
    logits, h = draft(ids, hidden, torch.arange(T)[None], cache, projected=False)
    prefix = cache.length
    pool = []  # (token, score, parent pool index)
    lp = torch.log_softmax(logits[0, -1].float(), -1)
    top = lp.topk(k)
    frontier = []
    for r in range(k):
        pool.append((int(draft.draft_to_target(top.indices[r])), float(top.values[r]), -1))
        frontier.append((len(pool) - 1, cache, h[:, -1:]))
    for step in range(1, steps):
        children = []
        for idx, node_cache, node_h in frontier:
            c = node_cache.clone()
            tok = torch.tensor([[pool[idx][0]]])
            lg, hn = draft(tok, node_h, torch.tensor([[prefix + step - 1]]), c, projected=True)
            lp = torch.log_softmax(lg[0, -1].float(), -1)
            top = lp.topk(k)
            for r in range(k):
                pool.append((int(draft.draft_to_target(top.indices[r])),
                             pool[idx][1] + float(top.values[r]), idx))
                children.append((len(pool) - 1, c, hn))
        children.sort(key=lambda ch: (-pool[ch[0]][1], ch[0]))
        frontier = children[:k]
    order = sorted(range(len(pool)), key=lambda i: (-pool[i][1], i))
    chosen = sorted(order[: settings.speculative_num_draft_tokens - 1])
    where = {p: i + 1 for i, p in enumerate(chosen)}
    parents = [-1] + [0 if pool[p][2] == -1 else where[pool[p][2]] for p in chosen]
    scores = [0.0] + [pool[p][1] for p in chosen]
    return [root] + [pool[p][0] for p in chosen], parents, scores


@pytest.mark.parametrize("steps,k,n", [(3, 2, 6), (4, 3, 10), (2, 4, 8), (3, 2, 11)])
def test_tree_matches_brute_force(make_tiny_draft, steps, k, n):
    draft = make_tiny_draft(HT, VOCAB, LAYOUT, draft_vocab=128, seed=steps * 10 + k)
    # a peaked draft makes cumulative scores differ between branches
    with torch.no_grad():
        draft.lm_head.weight.mul_(6.0)
    ids, hidden = _inputs(steps + k)
    settings = SpecSettings(steps, k, n)
    cache = draft.new_cache(1, 128)
    tree = draft_tree(draft, settings, int(ids[0, -1]), ids, hidden, cache)
    tokens, parents, scores = _reference_tree(draft, settings, int(ids[0, -1]), ids, hidden)
    assert list(tree.parents) == parents
    assert tree.tokens.tolist() == tokens
    torch.testing.assert_close(tree.scores, torch.tensor(scores), rtol=0, atol=2e-5)
    assert len(tree) == n
    assert tree.max_depth <= steps
    assert cache.length == ids.shape[1]
    # siblings are distinct tokens (top-k of one distribution)
    for node in range(len(tree)):
        kids, c = [], tree.first_child[node]
        while c != -1:
            kids.append(int(tree.tokens[c]))
            c = tree.next_sibling[c]
        assert len(kids) == len(set(kids))
