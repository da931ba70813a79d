"""The draft vocabulary: the target ids the draft can propose, chosen by frequency.

The draft's lm_head scores ``draft_vocab_size`` tokens instead of the target's
whole vocabulary. They are the most frequent target tokens among those the
draft is trained to predict. Ties, and the slots left when the answers hold
fewer distinct tokens than the draft vocabulary, go by a *prior* count (the
tokens of a larger prompt sample, which costs only tokenization), then to the
lower id (for BPE vocabularies the early, frequent merges). Stored as SGLang
stores them: ``d2t[i] = target_id(i) - i`` (draft ids in ascending target-id
order) and ``t2d`` a bool mask over the target vocabulary.
"""

from __future__ import annotations

import torch

from eagle3_backend.errors import Eagle3Error

__all__ = ["VocabMap", "build_vocab_map", "token_counts"]


class VocabMap:
    """Draft <-> target vocabulary maps built from ``target_ids`` [Vd] (ascending, unique)."""

    def __init__(self, target_ids: torch.Tensor, vocab_size: int):
        ids = torch.as_tensor(target_ids, dtype=torch.long)
        if ids.dim() != 1 or ids.numel() == 0 or not bool((ids[1:] > ids[:-1]).all()) \
                or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
            raise Eagle3Error(f"draft vocabulary must be ascending unique ids in [0, {vocab_size}), "
                              f"got {ids.numel()} ids.")
        self.target_ids = ids                                      # [Vd] draft id -> target id
        self.vocab_size = vocab_size
        self.d2t = ids - torch.arange(ids.numel())                 # [Vd] offsets (SGLang)
        self.t2d = torch.zeros(vocab_size, dtype=torch.bool)       # [V]
        self.t2d[ids] = True
        self.draft_of = torch.full((vocab_size,), -1, dtype=torch.long)  # [V] target -> draft
        self.draft_of[ids] = torch.arange(ids.numel())

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    def coverage(self, counts: torch.Tensor) -> float:
        """Share of the counted tokens the draft vocabulary contains."""
        total = counts.sum()
        return float(counts[self.t2d].sum() / total) if total > 0 else 0.0


def token_counts(token_lists: list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """How often each target id occurs: int64 [vocab_size]."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for t in token_lists:
        counts += torch.bincount(t.long(), minlength=vocab_size)[:vocab_size]
    return counts


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int,
                    prior: torch.Tensor | None = None) -> VocabMap:
    """The ``draft_vocab_size`` most frequent ids of ``counts`` [V].

    Ties (in particular ids never counted) are broken by ``prior`` [V] (counts in a
    larger text sample, e.g. the prompt corpus) and then by the lower id.
    """
    V = int(counts.numel())
    if not 1 <= draft_vocab_size <= V:
        raise Eagle3Error(f"draft vocabulary size {draft_vocab_size} must be in [1, {V}] "
                          f"(the target vocabulary). Lower --draft-vocab.")
    counts = counts.long()
    if prior is not None:
        prior = prior.long()
        if prior.shape != counts.shape or int(prior.min()) < 0:
            raise Eagle3Error(f"prior counts must be {V} non-negative integers, got "
                              f"{list(prior.shape)}.")
        counts = counts * (int(prior.max()) + 1) + prior      # lexicographic (count, prior)
    # stable sort on -key keeps ascending ids within equal keys
    order = torch.sort(-counts, stable=True).indices
    chosen = order[:draft_vocab_size]
    return VocabMap(chosen.sort().values, V)
