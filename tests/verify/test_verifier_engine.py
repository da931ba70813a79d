"""Offline speculative engine on the real SmolLM2 target (fp32): greedy identity, tree
verification, KV rollback, acceptance accounting."""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.errors import CheckpointError, LayoutMismatch
from eagle3_backend.verify.datasets import Prompt, render_prompt
from eagle3_backend.verify.engine import (
    PHASES,
    SpeculativeEngine,
    _causal_lm_forward,
    _new_cache,
    generate_target_only,
    keep_cache_rows,
    verify_greedy,
)
from eagle3_backend.verify.tree import DraftTree, SpecSettings

LAYOUT = "[layer_input:2, layer_input:15, layer_input:27]"  # SGLang's default for 30 layers
NEW_TOKENS = 16
PROMPTS = [
    Prompt("story", (("user", "Write a long story about a dragon who learns to fly."),)),
    Prompt("list", (("user", "List five uses of a paperclip, one per line."),)),
]


@pytest.fixture(scope="module")
def encoded(smol_target):
    return [render_prompt(smol_target.tokenizer, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def baseline(smol_target, encoded):
    torch.set_num_threads(1)
    return [generate_target_only(smol_target, ids, NEW_TOKENS) for ids in encoded]


@pytest.fixture
def random_draft(smol_target, make_tiny_draft):
    return make_tiny_draft(smol_target.hidden_size, smol_target.vocab_size, LAYOUT,
                           draft_vocab=2048, seed=0)


def test_baseline_is_plain_greedy(smol_target, encoded, baseline):
    # the cached decode loop equals argmax over a full recompute at every step
    ids = list(encoded[1])
    with torch.inference_mode():
        for tok in baseline[1].tokens[:6]:
            logits = smol_target.model(torch.tensor([ids])).logits[0, -1]
            assert int(logits.argmax()) == tok
            ids.append(tok)
    assert baseline[0].completion_tokens == NEW_TOKENS
    assert smol_target.tokenizer.decode(baseline[0].tokens).strip() != ""
    for run in baseline:  # the prompt's forward, then the decode loop: the whole run
        assert tuple(run.phases) == PHASES["target-only"] and min(run.phases.values()) > 0
        assert sum(run.phases.values()) == pytest.approx(run.seconds, rel=1e-9)


@pytest.mark.parametrize("settings", [SpecSettings(3, 1), SpecSettings(3, 4, 8)],
                         ids=["chain3", "tree3x4n8"])
def test_greedy_spec_identical_to_target_fp32(smol_target, encoded, baseline, random_draft, settings):
    engine = SpeculativeEngine(smol_target, random_draft, settings)
    for ids, base in zip(encoded, baseline):
        res = engine.generate(ids, NEW_TOKENS)
        assert res.tokens == base.tokens, (
            f"first difference at {next(i for i, (a, b) in enumerate(zip(res.tokens, base.tokens)) if a != b)}")
        assert res.verify_steps == len(res.accepted_per_step) >= 1
        # every step commits accepted + 1 tokens; the prefill commits the first one
        assert 1 + sum(a + 1 for a in res.accepted_per_step) >= res.completion_tokens
        assert all(0 <= a <= settings.speculative_num_steps for a in res.accepted_per_step)
        # the phases are disjoint spans of the run, each of them spent on every step
        assert tuple(res.phases) == PHASES["speculative"] and min(res.phases.values()) > 0
        assert sum(res.phases.values()) <= res.seconds


class OracleEngine(SpeculativeEngine):
    """Proposes trees that contain the reference continuation at known places, so the
    accept / commit / KV-rollback path runs with acceptance > 1 on the real target."""

    def __init__(self, *args, ref: list[int], shape: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.ref, self.shape = ref, shape

    def _propose(self, out, ext_ids, ext_hidden, draft_cache):
        L = len(out)
        nxt = [self.ref[i] if i < len(self.ref) else 0 for i in range(L, L + 3)]
        wrong = [(t + 1) % self.target.vocab_size for t in nxt]
        if self.shape == "tree":
            # root -> [wrong0, right0]; wrong0 -> [right1]; right0 -> [wrong1, right1]
            tokens = [out[-1], wrong[0], nxt[0], nxt[1], wrong[1], nxt[1]]
            parents = [-1, 0, 0, 1, 2, 2]
        else:  # chain right0, wrong1, right2: exactly one accepted
            tokens = [out[-1], nxt[0], wrong[1], nxt[2]]
            parents = [-1, 0, 1, 2]
        return DraftTree.from_parents(torch.tensor(tokens), parents)


@pytest.mark.parametrize("shape,expected_accept,steps", [("tree", 2, 5), ("chain", 1, 8)])
def test_oracle_draft_accepts_and_stays_identical(smol_target, encoded, baseline, random_draft,
                                                 shape, expected_accept, steps):
    ref = baseline[0].tokens
    assert len(ref) == NEW_TOKENS and not set(ref) & smol_target.eos_token_ids, \
        "precondition: the story prompt must not stop early"
    settings = SpecSettings(3, 2, 6) if shape == "tree" else SpecSettings(3, 1)
    engine = OracleEngine(smol_target, random_draft, settings, ref=ref, shape=shape)
    res = engine.generate(encoded[0], NEW_TOKENS)
    assert res.tokens == ref
    assert res.accepted_per_step == [expected_accept] * steps
    assert res.completion_tokens / res.verify_steps > 1.9


def test_eos_among_accepted_tokens_ends_the_request(smol_target, random_draft):
    ids = render_prompt(smol_target.tokenizer,
                        Prompt("fr", (("user", "What is the capital of France?"),)))
    ref = generate_target_only(smol_target, ids, NEW_TOKENS).tokens
    assert ref[-1] in smol_target.eos_token_ids and len(ref) < NEW_TOKENS, \
        "precondition: the answer must end with <|im_end|> within the budget"
    # the chain oracle commits 2 tokens a step (1 accepted + bonus): steps at 1, 3, 5, ...
    engine = OracleEngine(smol_target, random_draft, SpecSettings(3, 1), ref=ref, shape="chain")
    res = engine.generate(ids, NEW_TOKENS)
    assert res.tokens == ref
    eos_at = len(ref) - 1
    assert res.accepted_per_step == [1] * ((eos_at + 1) // 2)


@torch.inference_mode()
def test_tree_mask_and_cache_rollback_equal_a_fresh_causal_run(smol_target, encoded):
    prefix = encoded[1][:12]
    P = len(prefix)
    cache = _new_cache(smol_target)
    _causal_lm_forward(smol_target, torch.tensor([prefix]), torch.arange(P)[None], cache)
    #   root 0 -> [1, 2]; 2 -> [3]   (node 1 is a rejected sibling)
    tree = DraftTree.from_parents(torch.tensor([504, 3575, 282, 4649]), [-1, 0, 0, 2])
    pos = P - 0 + torch.tensor(tree.depths)[None]
    tree_logits = _causal_lm_forward(smol_target, tree.tokens[None], pos, cache,
                                      mask=tree.attention_mask(P))
    keep_cache_rows(cache, P, [0, 2, 3])
    path = [504, 282, 4649]
    fresh = _new_cache(smol_target)
    fresh_logits = _causal_lm_forward(smol_target, torch.tensor([prefix + path]),
                                      torch.arange(P + 3)[None], fresh)
    torch.testing.assert_close(tree_logits[[0, 2, 3]], fresh_logits[P:], rtol=1e-4, atol=1e-4)
    assert cache.get_seq_length() == fresh.get_seq_length() == P + 3
    for a, b in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-4)
    # decoding continues identically from both caches
    nxt = torch.tensor([[13]])
    p = torch.tensor([[P + 3]])
    torch.testing.assert_close(_causal_lm_forward(smol_target, nxt, p, cache),
                               _causal_lm_forward(smol_target, nxt, p, fresh), rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_in_place_cache_bit_equal_to_transformers_dynamic_cache(smol_target, encoded):
    """The engine's cache writes new positions into buffers allocated once and rolls back
    by moving the accepted rows, where transformers' DynamicCache concatenates: the same
    logits bit for bit through a prefill, a tree verify, a rollback to a non-contiguous
    path, a verify that outgrows the buffer (room for 5 rows past the prompt), a rollback after
    it and a decode; the buffers are reused in place, not reallocated, between growths. Until
    the growth every layer's keys and values are slices of one allocation (the first rollback
    moves all layers' rows in one copy); after it each layer holds its own."""
    from transformers import DynamicCache

    from eagle3_backend.verify.engine import in_place_layer

    prefix = encoded[0][:30]
    P = len(prefix)
    ours, theirs = _new_cache(smol_target, P + 5), DynamicCache(config=smol_target.model.config)
    assert all(type(layer) is in_place_layer() for layer in ours.layers)
    tree = DraftTree.from_parents(torch.tensor([504, 3575, 282, 4649, 314]), [-1, 0, 0, 2, 2])

    def steps(cache):
        out = [_causal_lm_forward(smol_target, torch.tensor([prefix]), torch.arange(P)[None],
                                  cache)]
        buffer = cache.layers[0].keys.data_ptr()
        shared = [getattr(layer, "shared", None) for layer in cache.layers]
        out.append(_causal_lm_forward(smol_target, tree.tokens[None],
                                      P + torch.tensor(tree.depths)[None], cache,
                                      mask=tree.attention_mask(P)))
        same_buffer = cache.layers[0].keys.data_ptr() == buffer
        keep_cache_rows(cache, P, [0, 2, 4])                     # root, node 2, node 4
        out.append(_causal_lm_forward(smol_target, tree.tokens[None],
                                      P + 3 + torch.tensor(tree.depths)[None], cache,
                                      mask=tree.attention_mask(P + 3)))
        shared.append(getattr(cache.layers[-1], "shared", None))
        keep_cache_rows(cache, P + 3, [0, 2])                    # root, node 2
        out.append(_causal_lm_forward(smol_target, torch.tensor([[13]]),
                                      torch.tensor([[P + 5]]), cache))
        return out, (same_buffer, shared), [(layer.keys.clone(), layer.values.clone())
                                  for layer in cache.layers]

    got, (same_buffer, shared), kv = steps(ours)
    want, _, kv_want = steps(theirs)
    assert same_buffer
    assert shared == [True] * smol_target.num_layers + [False]
    assert ours.layers[0].arena.storage.shape[:2] == (smol_target.num_layers, 2)
    assert ours.get_seq_length() == theirs.get_seq_length() == P + 6
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for (k, v), (kw, vw) in zip(kv, kv_want):
        assert torch.equal(k, kw) and torch.equal(v, vw)


@torch.inference_mode()
def test_few_query_attention_runs_the_kernel_rows_equal_their_decodes(smol_target, encoded,
                                                                      monkeypatch):
    """load_target puts the CPU target on grouped_sdpa_attention, which sends a sequence's few
    new queries (a decode, a 5-node tree verify) to the paged-attention kernel: SDPA is not
    called, the logits match transformers' sdpa to fp32 rounding, and every verified node's
    row is bit for bit the row a one-token decode of that node gives after its ancestors."""
    from transformers.integrations import sdpa_attention

    from eagle3_backend.verify import targets

    model = smol_target.model
    assert model.config._attn_implementation == targets.GROUPED_SDPA
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(a[0].shape[2]) or real_sdpa(*a, **k))
    prefix = encoded[0][:40]
    P = len(prefix)
    tree = DraftTree.from_parents(torch.tensor([504, 3575, 282, 4649, 314]), [-1, 0, 0, 2, 2])
    pos = P + torch.tensor(tree.depths)[None]
    got = {}
    try:
        for impl in (targets.GROUPED_SDPA, "sdpa"):
            model.set_attn_implementation(impl)
            cache = _new_cache(smol_target)
            _causal_lm_forward(smol_target, torch.tensor([prefix]), torch.arange(P)[None], cache)
            calls.clear()
            verify = _causal_lm_forward(smol_target, tree.tokens[None], pos, cache,
                                        mask=tree.attention_mask(P))
            keep_cache_rows(cache, P, [0, 2, 4])
            decode = _causal_lm_forward(smol_target, torch.tensor([[13]]), torch.tensor([[P + 3]]), cache)
            got[impl] = (verify, decode, list(calls))
    finally:
        model.set_attn_implementation(targets.GROUPED_SDPA)
    assert got[targets.GROUPED_SDPA][2] == [] and got["sdpa"][2] == [5] * smol_target.num_layers + [1] * smol_target.num_layers
    for ours, ref in zip(got[targets.GROUPED_SDPA][:2], got["sdpa"][:2]):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    # node n of the verify = a decode of n after the prefix and n's ancestors, bit for bit
    verify = got[targets.GROUPED_SDPA][0]
    for node in range(len(tree.tokens)):
        path = tree.path(node)
        cache = _new_cache(smol_target)
        _causal_lm_forward(smol_target, torch.tensor([prefix]), torch.arange(P)[None], cache)
        for depth, n in enumerate(path):
            row = _causal_lm_forward(smol_target, tree.tokens[n].view(1, 1),
                                     torch.tensor([[P + depth]]), cache)
        assert torch.equal(row[0], verify[node]), node


@torch.inference_mode()
def test_many_query_tree_verify_groups_kv_heads_bit_equal_to_transformers_sdpa(smol_target, encoded,
                                                                              monkeypatch):
    """A tree wider than the kernel takes (more than FEW_QUERIES nodes) stays on SDPA, whose
    grouped call never copies SmolLM2's 3 KV heads out to its 9 query heads, where
    transformers' sdpa does for every layer, and gives the same logits bit for bit."""
    from transformers.integrations import sdpa_attention

    from eagle3_backend.verify import targets

    model = smol_target.model
    repeats = []
    real_repeat = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv",
                        lambda x, n: repeats.append(n) or real_repeat(x, n))
    prefix = encoded[0][:40]
    P = len(prefix)
    n = targets.FEW_QUERIES + 2
    tree = DraftTree.from_parents(torch.arange(500, 500 + n), [-1] + [(i - 1) // 2 for i in range(1, n)])
    pos = P + torch.tensor(tree.depths)[None]
    got, copies = {}, {}
    try:
        for impl in (targets.GROUPED_SDPA, "sdpa"):
            model.set_attn_implementation(impl)
            cache = _new_cache(smol_target)
            _causal_lm_forward(smol_target, torch.tensor([prefix]), torch.arange(P)[None], cache)
            repeats.clear()
            got[impl] = _causal_lm_forward(smol_target, tree.tokens[None], pos, cache,
                                           mask=tree.attention_mask(P))
            copies[impl] = list(repeats)
    finally:
        model.set_attn_implementation(targets.GROUPED_SDPA)
    assert copies == {targets.GROUPED_SDPA: [], "sdpa": [3] * (2 * smol_target.num_layers)}
    assert torch.equal(got[targets.GROUPED_SDPA], got["sdpa"])


def test_verify_greedy_oracle_cases():
    #        0(root)
    #     1(5)    2(7)
    #   3(8)     4(9) 5(8)
    tree = DraftTree.from_parents(torch.tensor([1, 5, 7, 8, 9, 8]), [-1, 0, 0, 1, 2, 2])
    # target wants 7 after the root, 8 after node 2, 3 after node 5
    predict = torch.tensor([7, 0, 8, 0, 0, 3])
    assert verify_greedy(tree, predict) == ([0, 2, 5], 3)
    # nothing matches: only the root, the bonus is the target's token after it
    assert verify_greedy(tree, torch.tensor([6, 0, 0, 0, 0, 0])) == ([0], 6)
    # first sibling wins, then its child
    assert verify_greedy(tree, torch.tensor([5, 8, 0, 2, 0, 0])) == ([0, 1, 3], 2)
    chain = DraftTree.from_parents(torch.tensor([1, 2, 3, 4]), [-1, 0, 1, 2])
    assert verify_greedy(chain, torch.tensor([2, 3, 4, 11])) == ([0, 1, 2, 3], 11)
    assert verify_greedy(chain, torch.tensor([2, 9, 4, 11])) == ([0, 1], 9)


def test_verify_greedy_on_the_host_equals_the_op():
    """verify_greedy walks a CPU tree on Python lists; the verify_tree_greedy op (torch
    backend, SGLang's contract) accepts the same rows and bonus on random trees."""
    import random

    from eagle3_backend.ops import allocate_verify_outputs, verify_tree_greedy

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 12)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        tree = DraftTree.from_parents(torch.tensor([rng.randrange(4) for _ in range(n)]),
                                      parents)
        predict = torch.tensor([rng.randrange(4) for _ in range(n)])
        out = allocate_verify_outputs(1, n, tree.max_depth + 1, "cpu")
        row = lambda xs: torch.tensor([list(xs)])  # noqa: E731
        verify_tree_greedy(*out, tree.tokens[None], row(range(n)), row(tree.first_child),
                           row(tree.next_sibling), predict[None], backend="torch")
        k = int(out.accept_token_num[0])
        rows = out.accept_index[0, : k + 1].tolist()
        assert verify_greedy(tree, predict) == (rows, int(out.predicts[rows[-1]]))


def test_sampling_run_is_seeded(smol_target, encoded, random_draft):
    engine = SpeculativeEngine(smol_target, random_draft, SpecSettings(2, 2, 5))
    a = engine.generate(encoded[1], 6, temperature=0.8, seed=3)
    b = engine.generate(encoded[1], 6, temperature=0.8, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) >= 1
    assert all(0 <= t < smol_target.vocab_size for t in a.tokens)


def test_draft_for_another_target_is_refused(smol_target, make_tiny_draft):
    wrong_width = make_tiny_draft(512, smol_target.vocab_size, LAYOUT)
    with pytest.raises(LayoutMismatch, match="target_hidden_size is 512"):
        SpeculativeEngine(smol_target, wrong_width, SpecSettings())
    wrong_vocab = make_tiny_draft(smol_target.hidden_size, 32000, LAYOUT)
    with pytest.raises(CheckpointError, match=r"vocab_size \(the target vocabulary it predicts "
                                              r"into\) is 32000; expected 49152"):
        SpeculativeEngine(smol_target, wrong_vocab, SpecSettings())


@pytest.mark.gpu
def test_cuda_engine_greedy_identical_and_flashinfer_sampling(bundled_gguf, make_tiny_draft):
    from eagle3_backend.verify.targets import load_target

    target = load_target(bundled_gguf, "float32", "cuda")
    draft = make_tiny_draft(target.hidden_size, target.vocab_size, LAYOUT, draft_vocab=2048).to("cuda")
    ids = render_prompt(target.tokenizer, PROMPTS[0])
    base = generate_target_only(target, ids, NEW_TOKENS)
    for settings in (SpecSettings(3, 1), SpecSettings(3, 4, 8)):
        res = SpeculativeEngine(target, draft, settings).generate(ids, NEW_TOKENS)
        assert res.tokens == base.tokens, settings
    # temperature > 0 with a chain goes through flashinfer's chain_speculative_sampling
    engine = SpeculativeEngine(target, draft, SpecSettings(3, 1), sampling_backend="flashinfer")
    res = engine.generate(ids, 8, temperature=0.7, seed=0)
    assert 1 <= len(res.tokens) <= 8 and all(0 <= t < target.vocab_size for t in res.tokens)
