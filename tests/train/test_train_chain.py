"""The trainer's replayed chain (held-out acceptance): exact counts by hand, and equal to the
offline verifier's acceptance on the same target answers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3_backend.train.data import DataSequence, generate_batch
from eagle3_backend.train.trainer import (
    StepStats,
    chain_counts,
    collate,
    evaluate_top1,
    heldout_score,
    make_batches,
)
from eagle3_backend.train.vocab import VocabMap

SHIPPED = Path(__file__).resolve().parents[2] / "drafts" / "smollm2-135m-eagle3"


def _seq(tokens, prompt_len, labels=None, assistant=None):
    L = len(tokens)
    return DataSequence("s", torch.tensor(tokens), prompt_len, torch.zeros(L - 1, 4),
                        torch.zeros(L - 1, 2), labels=labels, assistant=assistant)


def _right(T, steps, trues):
    """right_rows [S] x [1, T] with True at the (step, row) pairs given."""
    rows = [torch.zeros(1, T, dtype=torch.bool) for _ in range(steps)]
    for j, i in trues:
        rows[j][0, i] = True
    return rows


def test_chain_counts_by_hand():
    # prompt x0..x2, answer x3..x11 (9 tokens: x3 from the prefill, 8 from verify steps)
    batch = collate([_seq(list(range(12)), 3)], 3)
    T = batch.aux.shape[1]                                             # 11 rows
    # row 2 (x3 committed): steps 0,1 right, 2 wrong -> accepts 2, emits x4..x6 (3 tokens)
    # row 5: nothing right -> 1 token (x7)
    # row 6: all three right -> 4 tokens (x8..x11); the answer ends there
    right = _right(T, 3, [(0, 2), (1, 2), (0, 6), (1, 6), (2, 6),
                          (1, 5), (2, 5)])                              # later steps alone count nothing
    assert chain_counts(batch, right) == (9, 3)
    # nothing right: one verify step per token after the first
    assert chain_counts(batch, _right(T, 3, [])) == (9, 8)


def test_chain_counts_skips_text_the_target_would_not_have_written():
    good = _seq(list(range(8)), 3)
    labels = torch.arange(1, 8)
    labels[4] = 99                                                     # the target chose otherwise
    forced = _seq(list(range(8)), 3, labels=labels)
    two_turns = _seq(list(range(8)), 2, assistant=torch.tensor([0, 0, 1, 1, 0, 1, 1, 1]).bool())
    batch = collate([good, forced, two_turns], 3)
    T = batch.aux.shape[1]
    rows = [torch.zeros(3, T, dtype=torch.bool) for _ in range(3)]
    assert chain_counts(batch, rows) == (5, 4)                         # the first sequence only
    st = StepStats.zeros(3)
    assert st.chain_acceptance() is None                               # nothing replayed
    # no replay: the independence estimate; with one, the replay first, the estimate second
    assert heldout_score(StepStats([0.0] * 3, [1] * 3, [2] * 3, [1] * 3)) == (1.875, 1.875)
    assert heldout_score(StepStats([0.0] * 3, [1] * 3, [2] * 3, [1] * 3, 9, 6)) == (1.5, 1.875)


@pytest.mark.slow
def test_replayed_chain_equals_the_offline_verifier(bundled_gguf):
    """On the real SmolLM2-135M and the shipped draft, the replay over the target's own
    greedy answers (generated in one padded batch, as the trainer's answer data is) counts
    exactly the tokens and verify steps that eagle3 eval's speculative engine takes on the
    same ShareGPT prompts with a chain of 3 drafts."""
    from eagle3_backend.verify.datasets import read_sharegpt, render_prompt
    from eagle3_backend.verify.engine import load_draft_model
    from eagle3_backend.verify.evaluate import evaluate
    from eagle3_backend.verify.targets import load_target
    from eagle3_backend.verify.tree import SpecSettings

    t = load_target(bundled_gguf, "float32", "cpu")
    model = load_draft_model(SHIPPED, t, dtype=torch.float32)
    model.set_target_embedding(t.model.get_input_embeddings().weight.detach())
    prompts = read_sharegpt(limit=6)[2:]
    ids = [render_prompt(t.tokenizer, p) for p in prompts]
    seqs, _ = generate_batch(t, ids, [p.id for p in prompts], model.config.layout, 32,
                             torch.float32)
    vocab = VocabMap(model.d2t + torch.arange(model.d2t.numel()), model.config.vocab_size)
    head = t.model.get_output_embeddings().weight.detach()[vocab.target_ids].float()
    st = evaluate_top1(model, make_batches(seqs, 4096, 3), vocab, head, 3)

    out = evaluate(t, model, prompts, SpecSettings(3, 1), max_new_tokens=32, baseline=False,
                   warmup=False)
    assert sum(r["completion_tokens"] for r in out["per_prompt"]) == st.chain_tokens == 128
    assert sum(r["verify_steps"] for r in out["per_prompt"]) == st.chain_steps
    assert 1.2 < st.chain_acceptance() < 3.0           # the draft is right, and not everywhere
