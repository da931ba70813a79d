"""TTT training: the unrolled steps equal inference-time chain drafting; one step lowers the loss."""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.config import DraftConfig
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout
from eagle3_backend.model import Eagle3DraftModel
from eagle3_backend.train.data import DataSequence, TrainingData
from eagle3_backend.train.trainer import (
    TrainSettings,
    build_draft,
    collate,
    evaluate_top1,
    expected_acceptance_length,
    make_batches,
    split_heldout,
    train_draft,
    ttt_forward,
    ttt_loss,
    ttt_mask,
)
from eagle3_backend.train.vocab import build_vocab_map, token_counts

H, V, VD, LAYOUT = 32, 96, 48, "[embed, layer_input:2]"


def synthetic_data(n_seqs: int = 6, seed: int = 0) -> TrainingData:
    """Random states; tokens follow x_{t+1} = (x_t + 5) mod 16 (one cycle through all 16) so there is something to learn,
    and the teacher's final states point at the next token through the lm_head."""
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(V, H, generator=gen)
    seqs = []
    for i in range(n_seqs):
        L = 16 + 3 * i
        x = [int(torch.randint(0, 16, (1,), generator=gen))]
        for _ in range(L - 1):
            x.append((x[-1] + 5) % 16)
        tokens = torch.tensor(x)
        aux = 0.1 * torch.randn(L - 1, 2 * H, generator=gen)
        aux[:, :H] = embed[tokens[:-1]]                      # slot 0 is the embedding, as named
        final = 4 * embed[tokens[1:]] / embed[tokens[1:]].norm(dim=-1, keepdim=True)
        seqs.append(DataSequence(f"s{i}", tokens, 3, aux, final))
    return TrainingData(layout=Layout.parse(LAYOUT), sequences=seqs, embed=embed, lm_head=embed,
                        final_norm=torch.ones(H))


def draft_config(**kw) -> DraftConfig:
    fields = dict(hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=V, draft_vocab_size=VD, target_hidden_size=H, layout=LAYOUT,
                  has_embed_tokens=False, dtype="float32", max_position_embeddings=256)
    fields.update(kw)
    return DraftConfig(**fields)


@pytest.fixture
def setup():
    data = synthetic_data()
    vocab = build_vocab_map(token_counts([s.tokens for s in data.sequences], V), VD)
    model = build_draft(draft_config(), data, vocab, seed=0)
    return data, vocab, model


def test_ttt_mask_exact():
    m = ttt_mask(3, 2)[0].int().tolist()
    assert m == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                 [1, 1, 0, 0, 1, 0, 0, 1, 0],
                 [1, 1, 1, 0, 0, 1, 0, 0, 1]]


@pytest.mark.parametrize("layers", [1, 2])
@torch.no_grad()
def test_ttt_steps_equal_inference_chain_drafting(setup, layers):
    """Row i, TTT step j == drafting above the committed prefix 0..i with a KV cache,
    fed the (teacher-forced) tokens and the draft's own hidden, as verify.tree does
    (also through a second decoder layer: doctor scores multi-layer drafts with TTT)."""
    data, vocab, model = setup
    if layers > 1:
        model = build_draft(draft_config(num_hidden_layers=layers), data, vocab, seed=0)
    S = 3
    seq = data.sequences[2]
    batch = collate([seq], S)
    ttt = [n @ model.head_weight.T for n in ttt_forward(model, batch.tokens, batch.aux, S)]
    T = batch.aux.shape[1]
    for i in (0, 4, T - 1):
        cache = model.new_cache(1, i + 1 + S)
        logits, hidden = model(seq.tokens[None, 1:i + 2], seq.aux[None, :i + 1].float(),
                               cache=cache, projected=False)
        torch.testing.assert_close(ttt[0][0, i], logits[0, -1], rtol=1e-5, atol=1e-5)
        h = hidden[:, -1:]
        for j in range(1, S):
            tok = batch.tokens[None, 0, i + 1 + j: i + 2 + j]               # x_{i+1+j}
            pos = torch.tensor([[i + j]])
            logits, h = model(tok, h, pos, cache, projected=True)
            torch.testing.assert_close(ttt[j][0, i], logits[0, -1], rtol=1e-5, atol=1e-5,
                                       msg=f"row {i} step {j}")


def test_ttt_rows_do_not_see_padding_or_other_sequences(setup):
    data, vocab, model = setup
    a, b = data.sequences[0], data.sequences[5]                      # lengths 16 and 31
    alone = list(ttt_forward(model, collate([a], 2).tokens, collate([a], 2).aux, 2))
    both = collate([a, b], 2)
    together = list(ttt_forward(model, both.tokens, both.aux, 2))
    T = a.aux.shape[0]
    for j in range(2):
        torch.testing.assert_close(together[j][0, :T], alone[j][0], rtol=1e-5, atol=1e-5)


def test_one_step_lowers_the_loss(setup):
    data, vocab, model = setup
    torch.manual_seed(0)
    head = data.lm_head[vocab.target_ids]
    batch = collate(data.sequences[:3], 3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before, stats = ttt_loss(model, batch, vocab, head, 3)
    assert stats.loss_rows[0] > 0 and stats.rows[0] >= stats.loss_rows[0]
    before.backward()
    opt.step()
    with torch.no_grad():
        after, _ = ttt_loss(model, batch, vocab, head, 3)
    assert float(after) < float(before.detach())
    assert model.target_embedding is data.embed                      # shared, not trained


def test_scored_rows_are_answer_rows_with_a_known_next_token(setup):
    data, vocab, model = setup
    seq = data.sequences[0]                                          # L=16, prompt 3
    _, stats = ttt_loss(model, collate([seq], 3), vocab, data.lm_head[vocab.target_ids], 3)
    # rows i >= prompt_len - 1 = 2 whose target position i+1+j <= L-2 = 14 (x_{i+2+j} known)
    assert stats.rows == [12, 11, 10]


def test_prompt_rows_add_loss_but_not_statistics(setup):
    data, vocab, model = setup
    batch = collate(data.sequences[:3], 2)
    head = data.lm_head[vocab.target_ids]
    with torch.no_grad():
        plain, s0 = ttt_loss(model, batch, vocab, head, 2)
        mixed, s1 = ttt_loss(model, batch, vocab, head, 2, prompt_weight=0.5)
    assert (s0.rows, s0.correct, s0.loss_rows) == (s1.rows, s1.correct, s1.loss_rows)
    assert s0.loss == pytest.approx(s1.loss)
    assert float(mixed) != pytest.approx(float(plain))


def test_training_learns_the_synthetic_rule(setup):
    data, vocab, model = setup
    train, held = split_heldout(data.sequences, 0.34, seed=0)
    assert len(held) == 2 and not {s.id for s in train} & {s.id for s in held}
    res = train_draft(model, train, held, vocab, data.lm_head,
                      TrainSettings(ttt_steps=2, steps=60, batch_tokens=64, lr=3e-3, warmup_steps=5))
    assert res.steps_done == 60 and not res.stopped_by_deadline
    top1 = res.heldout_stats.top1()
    assert top1[0] > 0.9, top1                                       # the rule is deterministic
    # held-out measured after each epoch and at the end; the best weights are returned
    assert res.heldout_curve[-1]["step"] == 60 and len(res.heldout_curve) >= 2
    # the replayed chain ranks the checkpoints; the independence estimate breaks its ties
    best = max(res.heldout_curve,
               key=lambda r: (r["chain_acceptance_length"], r["expected_acceptance_length"]))
    assert res.best_step == best["step"]
    again = evaluate_top1(res.model, make_batches(held, 64, 2), vocab,
                          data.lm_head[vocab.target_ids], 2)
    assert again.top1() == top1
    assert res.loss_curve[-1][1] < res.loss_curve[0][1] / 4


def test_deadline_shrinks_the_run(setup):
    import time

    data, vocab, model = setup
    res = train_draft(model, data.sequences[:4], [], vocab, data.lm_head,
                      TrainSettings(ttt_steps=2, steps=100_000, batch_tokens=64),
                      deadline=time.perf_counter() + 1.0)
    assert 3 <= res.steps_done < 100_000 and res.stopped_by_deadline
    assert res.heldout_stats is None and res.steps_planned == 100_000


def test_batches_respect_the_token_budget_and_keep_every_sequence():
    data = synthetic_data(8)
    batches = make_batches(data.sequences, 60, 2)
    # rows 15, 18, ..., 36: [15, 18] [21, 24] [27, 30] [33] [36] (B * longest <= 60)
    assert sorted(b.lengths.tolist() for b in batches) == [[16, 19], [22, 25], [28, 31], [34], [37]]
    assert sum(b.aux.shape[0] for b in batches) == 8
    assert all(b.rows <= 60 for b in batches)


def test_expected_acceptance_length():
    assert expected_acceptance_length([0.5, 0.5, 0.5]) == pytest.approx(1.875)
    assert expected_acceptance_length([None]) is None


def test_build_draft_checks(setup):
    data, vocab, _ = setup
    with pytest.raises(Eagle3Error, match="has_embed_tokens=False"):
        build_draft(draft_config(has_embed_tokens=True), data, vocab)
    with pytest.raises(Eagle3Error, match="differs from the data's layout"):
        build_draft(draft_config(layout="[embed, layer_input:3]"), data, vocab)
    with pytest.raises(Eagle3Error, match="batch_tokens"):
        TrainSettings(batch_tokens=0)
