"""KV-slot bookkeeping and draft-tree ops: exact expected values and the loop reference."""

from __future__ import annotations

import random

import pytest
import torch

from eagle3_backend.cpu.ops import reference


def _rtt(seed: int, rows: int = 5, cols: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1000, (rows, cols), generator=g, dtype=torch.int32)


def test_assign_req_to_token_pool_scatters_ranges(sgl_ops):
    rtt = torch.zeros(4, 10, dtype=torch.int32)
    rpi = torch.tensor([3, 1], dtype=torch.int64)
    start = torch.tensor([2, 0], dtype=torch.int32)
    end = torch.tensor([5, 2], dtype=torch.int32)
    loc = torch.tensor([11, 12, 13, 21, 22, 99], dtype=torch.int64)  # one spare entry
    sgl_ops.assign_req_to_token_pool_cpu(rpi, rtt, start, end, loc, 10)
    expected = torch.zeros(4, 10, dtype=torch.int32)
    expected[3, 2:5] = torch.tensor([11, 12, 13])
    expected[1, 0:2] = torch.tensor([21, 22])
    assert torch.equal(rtt, expected)


def test_assign_extend_cache_locs_gathers_ranges(sgl_ops):
    rtt = _rtt(0)
    rpi = torch.tensor([4, 0, 2], dtype=torch.int64)
    start = torch.tensor([3, 10, 0], dtype=torch.int64)
    end = torch.tensor([7, 10, 2], dtype=torch.int64)
    out = torch.full((8,), -7, dtype=torch.int64)
    sgl_ops.assign_extend_cache_locs_cpu(rpi, rtt, start, end, out, rtt.shape[1])
    expected = torch.cat([rtt[4, 3:7], rtt[2, 0:2]]).long()
    assert torch.equal(out[:6], expected)
    assert torch.equal(out[6:], torch.full((2,), -7))


def test_assign_draft_cache_locs_contiguous(sgl_ops):
    rtt = _rtt(1)
    rpi = torch.tensor([1, 3], dtype=torch.int64)
    seq = torch.tensor([4, 9], dtype=torch.int32)
    topk, steps = 2, 3
    out = torch.empty(2 * topk * steps, dtype=torch.int64)
    sgl_ops.assign_draft_cache_locs_contiguous_cpu(rpi, rtt, seq, out, rtt.shape[1], topk, steps)
    assert torch.equal(out, torch.cat([rtt[1, 4:10], rtt[3, 9:15]]).long())


def test_build_draft_decode_metadata_rows_per_candidate(sgl_ops):
    rtt = _rtt(2)
    rpi = torch.tensor([2, 0], dtype=torch.int64)
    seq = torch.tensor([5, 3], dtype=torch.int64)
    topk, steps = 3, 2
    out = sgl_ops.build_draft_decode_metadata_cpu(rtt, rpi, seq, topk, steps, rtt.shape[1])
    assert out.shape == (6, rtt.shape[1]) and out.dtype == torch.int32
    for b in range(2):
        r, sl = int(rpi[b]), int(seq[b])
        for t in range(topk):
            row = out[b * topk + t]
            assert torch.equal(row[:sl], rtt[r, :sl])
            assert torch.equal(row[sl:sl + steps], rtt[r, sl + t * steps: sl + (t + 1) * steps])


def test_fill_bonus_tokens_takes_last_accepted(sgl_ops):
    accept_tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], dtype=torch.int32)
    lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    bonus = torch.zeros(3, dtype=torch.int32)
    sgl_ops.fill_bonus_tokens_cpu(accept_tokens, lens, bonus, 4)
    assert bonus.tolist() == [5, 12, 14]


def test_fill_accept_out_cache_loc_compacts_in_order(sgl_ops):
    accept_index = torch.tensor([[0, 2, -1], [4, -1, -1], [6, 7, 8]], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 109, dtype=torch.int64)
    out = torch.full((9,), -1, dtype=torch.int64)
    sgl_ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)
    assert out.tolist() == [100, 102, 104, 106, 107, 108, -1, -1, -1]


def _random_tree(rng: random.Random, topk: int, depth: int, n: int):
    """An EAGLE-shaped draft: parent_list [topk*(depth-1)+1] and sorted selected_index [n-1].

    Step 0 offers candidates 0..topk-1 (parent slot 0 = root); step t >= 1 expands
    the topk beams chosen at step t-1 (recorded in parent_list) into topk each.
    """
    parent_list = [-1]
    cand_parent = {c: None for c in range(topk)}          # candidate -> parent candidate
    prev = list(range(topk))
    for t in range(1, depth):
        beams = rng.sample(prev, topk)
        base = topk + (t - 1) * topk * topk
        prev = []
        for j, beam in enumerate(beams):
            parent_list.append(beam)
            for k in range(topk):
                c = base + j * topk + k
                cand_parent[c] = beam
                prev.append(c)
    chosen: set[int] = set()
    order = list(cand_parent)
    while len(chosen) < n - 1:
        c = rng.choice(order)
        path = []
        while c is not None and c not in chosen:
            path.append(c)
            c = cand_parent[c]
        if len(chosen) + len(path) <= n - 1:
            chosen.update(path)
    return parent_list, sorted(chosen)


def _build(sgl_ops, parents, selected, seq_lens, topk, depth, n, mode=1):
    bs = len(selected)
    pl = torch.tensor(parents, dtype=torch.int64)
    si = torch.tensor(selected, dtype=torch.int64)
    sl = torch.tensor(seq_lens, dtype=torch.int64)
    if mode == 1:
        mask = torch.full((bs * n * n,), True)
    else:
        mask = torch.full((sum(seq_lens) * n + bs * n * n,), True)
    pos = torch.empty(bs * n, dtype=torch.int64)
    buf = torch.full((3, bs, n), -1, dtype=torch.int64)
    sgl_ops.build_tree_kernel_efficient_cpu(pl, si, sl, mask, pos, buf[0], buf[1], buf[2],
                                            topk, depth, n, mode)
    return mask, pos, buf


def test_build_tree_exact_small_tree(sgl_ops):
    # topk 2, depth 2: step 0 candidates {0, 1}; beams [1, 0] expand to 2,3 (under 1) and 4,5 (under 0).
    parents = [[-1, 1, 0]]
    selected = [[0, 1, 2, 4]]          # nodes 1..4: cand 0 (root), cand 1 (root), 2 (under 1), 4 (under 0)
    mask, pos, buf = _build(sgl_ops, parents, selected, [10], topk=2, depth=2, n=5)
    assert pos.tolist() == [10, 11, 11, 12, 12]
    assert buf[0].tolist() == [[0, 1, 2, 3, 4]]
    assert buf[1].tolist() == [[1, 4, 3, -1, -1]]   # root -> node 1; node 1 (cand 0) -> node 4; node 2 -> node 3
    assert buf[2].tolist() == [[-1, 2, -1, -1, -1]]
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 0, 1, 0, 0],
                             [1, 0, 1, 1, 0],
                             [1, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask.view(5, 5), expected)


@pytest.mark.parametrize("topk,depth,n,mode", [(1, 4, 4, 1), (4, 3, 8, 1), (3, 4, 10, 0), (2, 5, 6, 0)])
def test_build_tree_matches_reference(sgl_ops, topk, depth, n, mode):
    rng = random.Random(topk * 100 + n)
    trees = [_random_tree(rng, topk, depth, n) for _ in range(3)]
    parents = [t[0] for t in trees]
    selected = [t[1] for t in trees]
    seq_lens = [7, 1, 12]
    mask, pos, buf = _build(sgl_ops, parents, selected, seq_lens, topk, depth, n, mode)
    ref_mask, ref_pos, ref_next, ref_sib = reference.build_tree(parents, selected, seq_lens, topk, n)
    assert pos.tolist() == ref_pos
    assert buf[1].tolist() == ref_next
    assert buf[2].tolist() == ref_sib
    if mode == 1:
        assert torch.equal(mask.view(3, n, n), ref_mask)
    else:
        off = 0
        for b, sl in enumerate(seq_lens):
            rows = mask[off: off + n * (sl + n)].view(n, sl + n)
            assert rows[:, :sl].all()                        # prefix untouched (pre-filled True)
            assert torch.equal(rows[:, sl:], ref_mask[b])
            off += n * (sl + n)


@pytest.mark.parametrize("topk,depth,n", [(1, 4, 4), (4, 3, 8), (3, 4, 10)])
def test_verify_tree_greedy_matches_reference(sgl_ops, topk, depth, n):
    rng = random.Random(7 + n)
    bs, steps = 4, depth + 1
    trees = [_random_tree(rng, topk, depth, n) for _ in range(bs)]
    _, _, buf = _build(sgl_ops, [t[0] for t in trees], [t[1] for t in trees], [5] * bs, topk, depth, n)
    parents = [reference.tree_parents(p, s, topk) for p, s in trees]
    cand = [[rng.randrange(6) for _ in range(n)] for _ in range(bs)]
    # target agrees with some child at each node half the time, so paths of every length occur
    target = []
    for b in range(bs):
        row = []
        for node in range(n):
            kids = [c for c in range(1, n) if parents[b][c] == node]
            row.append(cand[b][rng.choice(kids)] if kids and rng.random() < 0.7 else 50 + node)
        target.append(row)
    predicts = torch.full((bs * n,), -3, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), -3, dtype=torch.int32)
    sgl_ops.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=torch.tensor(cand, dtype=torch.int64), retrive_index=buf[0],
        retrive_next_token=buf[1], retrive_next_sibling=buf[2],
        target_predict=torch.tensor(target, dtype=torch.int64))
    ref_accept, ref_num, ref_pred = reference.verify_greedy(cand, parents, target, steps)
    assert accept_index.tolist() == ref_accept
    assert accept_num.tolist() == ref_num
    expected_pred = [-3] * (bs * n)
    for i, tok in ref_pred.items():
        expected_pred[i] = tok
    assert predicts.tolist() == expected_pred


def test_verify_chain_exact(sgl_ops):
    # A chain of 3 drafts; the target agrees with the first two, so 2 accepted + bonus 42.
    nxt = torch.tensor([[1, 2, 3, -1]])
    sib = torch.full((1, 4), -1)
    ri = torch.arange(4).view(1, 4)
    cand = torch.tensor([[9, 20, 21, 22]])
    target = torch.tensor([[20, 21, 42, 43]])
    predicts = torch.zeros(4, dtype=torch.int32)
    accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    num = torch.zeros(1, dtype=torch.int32)
    sgl_ops.verify_tree_greedy_cpu(predicts, accept_index, num, cand, ri, nxt, sib, target)
    assert accept_index.tolist() == [[0, 1, 2, -1]]
    assert num.tolist() == [2]
    assert predicts.tolist() == [20, 21, 42, 0]


@pytest.mark.parametrize("kernel_on", [True, False], ids=["kernel", "torch"])
def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer(sgl_ops, kernel_on, monkeypatch):
    """The same moves through the C++ copy and the torch path (kernels off)."""
    from eagle3_backend.cpu import small_gemm

    if not kernel_on:
        monkeypatch.setitem(small_gemm._state, "module", None)
    g = torch.Generator().manual_seed(3)
    bufs = [torch.randn(10, 3, 4, generator=g), torch.randn(10, 2, 8, generator=g).to(torch.bfloat16)]
    before = [b.clone() for b in bufs]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    tgt = torch.tensor([2, 3, 9], dtype=torch.int64)
    src = torch.tensor([7, 2, 0], dtype=torch.int64)  # row 2 is both read and overwritten
    sgl_ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        expected = old.clone()
        expected[tgt] = old[src]
        assert torch.equal(b, expected)


def test_ops_have_mutation_annotations(sgl_ops):
    """Every tensor an op writes is declared mutable in its schema; nothing else is."""
    writes = {
        "extend_attention_cpu": {"o_extend"},
        "decode_attention_cpu": {"k_cache", "v_cache", "output"},
        "assign_req_to_token_pool_cpu": {"req_to_token"},
        "assign_extend_cache_locs_cpu": {"out_cache_loc"},
        "assign_draft_cache_locs_contiguous_cpu": {"out_cache_loc"},
        "build_draft_decode_metadata_cpu": set(),
        "fill_bonus_tokens_cpu": {"bonus_tokens"},
        "fill_accept_out_cache_loc_cpu": {"accept_out_cache_loc"},
        "build_tree_kernel_efficient_cpu": {"tree_mask", "positions", "retrive_index",
                                            "retrive_next_token", "retrive_next_sibling"},
        "verify_tree_greedy_cpu": {"predicts", "accept_index", "accept_token_num"},
        "copy_all_layer_kv_cache_cpu": set(),
    }
    from eagle3_backend.cpu.ops import registry

    assert set(writes) == set(registry.OPS)
    for name, expected in writes.items():
        schema = getattr(sgl_ops, name).default._schema
        mutable = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert mutable == expected, f"{name}: schema marks {sorted(mutable)} as written"
