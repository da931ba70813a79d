"""Draft vocabulary from token frequencies: exact maps on hand examples."""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.train.vocab import VocabMap, build_vocab_map, token_counts


def test_counts_and_top_by_frequency_ties_to_lower_id():
    counts = token_counts([torch.tensor([3, 3, 3, 7, 7, 1, 9]), torch.tensor([7, 2])], 10)
    assert counts.tolist() == [0, 1, 1, 3, 0, 0, 0, 3, 0, 1]
    vm = build_vocab_map(counts, 3)
    # 3 and 7 (3 each), then the lowest of the ids seen once (1, 2, 9): 1
    assert vm.target_ids.tolist() == [1, 3, 7]
    assert vm.d2t.tolist() == [1, 2, 5]                      # target = draft id + d2t
    assert vm.t2d.nonzero().flatten().tolist() == [1, 3, 7]
    assert vm.draft_of.tolist() == [-1, 0, -1, 1, -1, -1, -1, 2, -1, -1]
    assert vm.coverage(counts) == pytest.approx(7 / 9)


def test_fewer_distinct_tokens_than_draft_vocab_fills_lowest_unused_ids():
    counts = token_counts([torch.tensor([3, 3, 3, 7, 7, 1, 9, 7, 2])], 10)
    vm = build_vocab_map(counts, 6)
    assert vm.target_ids.tolist() == [0, 1, 2, 3, 7, 9]      # 5 seen + lowest unused (0)
    assert vm.coverage(counts) == 1.0


def test_prior_breaks_ties_and_fills_unseen_slots():
    counts = torch.tensor([0, 1, 1, 3, 0, 0, 0, 3, 0, 1])
    prior = torch.tensor([0, 5, 0, 1, 9, 0, 2, 7, 0, 5])
    # 3 and 7 (3 each; prior 1 < 7 so 7 first), then count-1 ids by prior: 1 (5), 9 (5), 2 (0)
    assert build_vocab_map(counts, 4, prior).target_ids.tolist() == [1, 3, 7, 9]
    # unseen ids by prior: 4 (9), then 6 (2)
    assert build_vocab_map(counts, 7, prior).target_ids.tolist() == [1, 2, 3, 4, 6, 7, 9]
    with pytest.raises(Eagle3Error, match="prior counts"):
        build_vocab_map(counts, 4, torch.ones(3, dtype=torch.long))


def test_model_maps_agree_with_vocab_map(tiny_draft):
    from eagle3_backend.model import Eagle3DraftModel

    loaded = tiny_draft()                                    # vocab 512, draft vocab 128
    model = Eagle3DraftModel.init_random(loaded.config, seed=0)
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (512,), generator=gen)
    vm = build_vocab_map(counts, 128)
    model.set_vocab_map(vm.target_ids)
    assert torch.equal(model.d2t, vm.d2t)
    assert torch.equal(model.t2d, vm.t2d)
    assert torch.equal(model.draft_to_target(torch.arange(128)), vm.target_ids)
    # the chosen ids are exactly the 128 largest counts (ties to the lower id)
    ranked = sorted(range(512), key=lambda i: (-int(counts[i]), i))[:128]
    assert vm.target_ids.tolist() == sorted(ranked)


def test_bad_sizes_are_refused():
    with pytest.raises(Eagle3Error, match="draft vocabulary size 11"):
        build_vocab_map(torch.ones(10, dtype=torch.long), 11)
    with pytest.raises(Eagle3Error, match="ascending unique"):
        VocabMap(torch.tensor([3, 3]), 10)
