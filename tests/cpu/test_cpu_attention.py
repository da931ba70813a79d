"""extend_attention_cpu / decode_attention_cpu against the plain-loop reference, each
through both paths: the C++ kernel (kernels/paged_attention.cpp) and the torch one.

Shapes follow SGLang's MHA pool: a shared cache of S rows, requests mapped to
scattered rows through req_to_token; GQA with 6 query heads over 2 KV heads.
"""

from __future__ import annotations

import pytest
import torch

from cpu_testutil import assert_close_report
from eagle3_backend.cpu.ops import attention, reference

HQ, HKV, D, DV = 6, 2, 16, 16
S, POOL_LEN = 96, 32
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 3e-2)}


@pytest.fixture(params=["kernel", "torch"], autouse=True)
def path(request, monkeypatch):
    """Which implementation the registered ops run (variants the kernel leaves to torch,
    sinks and the long-extend SDPA path, run the torch one under both)."""
    if request.param == "kernel":
        mod = attention.kernel()
        assert mod is not None, ("the attention kernel did not build on this machine (see the log); "
                                 "the CI machine has g++ and ninja, so this is a defect")
        monkeypatch.setitem(attention._kernel_state, "module", mod)
    else:
        monkeypatch.setitem(attention._kernel_state, "module", None)
    return request.param


def _setup(seed: int, seq_lens: list[int], dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k_buf = torch.randn(S, HKV, D, generator=g).to(dtype)
    v_buf = torch.randn(S, HKV, DV, generator=g).to(dtype)
    rows = torch.randperm(S - 1, generator=g)[: sum(seq_lens)] + 1   # row 0 is SGLang's padding slot
    req_to_token = torch.zeros(4, POOL_LEN, dtype=torch.int32)
    rpi = torch.tensor([2, 0, 3][: len(seq_lens)], dtype=torch.int64)
    off = 0
    for b, n in enumerate(seq_lens):
        req_to_token[rpi[b], :n] = rows[off:off + n].int()
        off += n
    return g, k_buf, v_buf, req_to_token, rpi


def _extend_case(seed, prefix, ext, dtype=torch.float32):
    seq = [p + e for p, e in zip(prefix, ext)]
    g, k_buf, v_buf, rtt, rpi = _setup(seed, seq, dtype)
    n = sum(ext)
    q = torch.randn(n, HQ, D, generator=g).to(dtype)
    k_ext = torch.randn(n, HKV, D, generator=g).to(dtype)
    v_ext = torch.randn(n, HKV, DV, generator=g).to(dtype)
    start = torch.tensor([sum(ext[:b]) for b in range(len(ext))], dtype=torch.int32)
    return dict(q=q, k_ext=k_ext, v_ext=v_ext, k_buf=k_buf, v_buf=v_buf, rtt=rtt, rpi=rpi,
                seq=torch.tensor(seq, dtype=torch.int64), ext=torch.tensor(ext, dtype=torch.int32),
                start=start, max_ext=max(ext))


def _run_extend(ops, c, *, logit_cap=0.0, window=0, sinks=None, tree_mask=None, causal=True,
                k_from_cache=False):
    o = torch.full_like(c["q"][..., :DV], float("nan"))
    k_ext, v_ext = (None, None) if k_from_cache else (c["k_ext"], c["v_ext"])
    ops.extend_attention_cpu(c["q"], k_ext, v_ext, o, c["k_buf"], c["v_buf"], 1.0, 1.0, c["rtt"],
                             c["rpi"], c["seq"], c["ext"], c["start"], c["max_ext"], D ** -0.5,
                             logit_cap, False, window, None, sinks, tree_mask, causal)
    return o


def _ref_extend(c, **kw):
    return reference.extend_attention(c["q"], c["k_ext"], c["v_ext"], c["k_buf"], c["v_buf"], c["rtt"],
                                      c["rpi"], c["seq"], c["ext"], c["start"], D ** -0.5, **kw)


@pytest.mark.parametrize("variant", ["plain", "logit_cap", "sinks", "window", "not_causal"])
def test_extend_matches_reference(sgl_ops, variant):
    c = _extend_case(1, prefix=[0, 5, 9], ext=[4, 1, 3])
    kw = {"plain": {}, "logit_cap": {"logit_cap": 2.0}, "window": {"window": 4},
          "sinks": {"sinks": torch.linspace(-1.0, 1.5, HQ)}, "not_causal": {"causal": False}}[variant]
    ref_kw = {("window_plus_one" if k == "window" else "is_causal" if k == "causal" else k): v
              for k, v in kw.items()}
    got = _run_extend(sgl_ops, c, **kw)
    assert_close_report(got, _ref_extend(c, **ref_kw), *TOL[torch.float32], what=f"extend {variant}")


def test_extend_reads_extend_kv_from_cache_when_not_given(sgl_ops):
    c = _extend_case(2, prefix=[3, 0], ext=[2, 5])
    # SGLang's KV-shared layers pass k=v=None after another layer wrote the cache.
    for b in range(2):
        p, e, s0 = int(c["seq"][b] - c["ext"][b]), int(c["ext"][b]), int(c["start"][b])
        slots = c["rtt"][c["rpi"][b], p:p + e].long()
        c["k_buf"][slots] = c["k_ext"][s0:s0 + e]
        c["v_buf"][slots] = c["v_ext"][s0:s0 + e]
    got = _run_extend(sgl_ops, c, k_from_cache=True)
    assert_close_report(got, _ref_extend(c), *TOL[torch.float32], what="extend k from cache")


def test_mha_prefill_over_an_mla_latent_cache(sgl_ops):
    # DeepSeek's fresh prefill: q/k [N, H, 192], v [N, H, 128] while the cache holds the MLA
    # latent [S, 1, 576] (written by the model itself); nothing cached precedes the extend.
    g = torch.Generator().manual_seed(9)
    ext = [3, 5]
    n, h, dqk, dv = sum(ext), 4, 24, 16
    q, k = torch.randn(n, h, dqk, generator=g), torch.randn(n, h, dqk, generator=g)
    v = torch.randn(n, h, dv, generator=g)
    latent = torch.randn(S, 1, 40, generator=g)
    rtt = torch.zeros(2, POOL_LEN, dtype=torch.int32)
    rtt[0, :3], rtt[1, :5] = torch.arange(1, 4), torch.arange(4, 9)
    args = (torch.tensor([0, 1]), torch.tensor(ext, dtype=torch.int64), torch.tensor(ext, dtype=torch.int32),
            torch.tensor([0, 3], dtype=torch.int32), 5, dqk ** -0.5, 0.0, False, 0, None, None, None, True)
    o = torch.full((n, h, dv), float("nan"))
    sgl_ops.extend_attention_cpu(q, k, v, o, latent, latent[..., :32], 1.0, 1.0, rtt, *args)
    for b, (s0, e) in enumerate(((0, 3), (3, 5))):
        want = torch.nn.functional.scaled_dot_product_attention(
            q[s0:s0 + e].transpose(0, 1), k[s0:s0 + e].transpose(0, 1), v[s0:s0 + e].transpose(0, 1),
            is_causal=True).transpose(0, 1)
        assert_close_report(o[s0:s0 + e], want, 2e-5, 2e-5, what=f"MHA prefill request {b}")
    # with a cached prefix the latent cache cannot be read as keys: refused by name
    seq = torch.tensor([4, 5], dtype=torch.int64)
    with pytest.raises(NotImplementedError, match=r"an MLA latent cache under an MHA extend"):
        sgl_ops.extend_attention_cpu(q[:6], k[:6], v[:6], o[:6], latent, latent[..., :32], 1.0, 1.0, rtt,
                                     torch.tensor([0, 1]), seq, torch.tensor([1, 5], dtype=torch.int32),
                                     torch.tensor([0, 1], dtype=torch.int32), 5, dqk ** -0.5, 0.0, False,
                                     0, None, None, None, True)


def test_extend_tree_mask_restricts_draft_block(sgl_ops):
    # Verify with a 4-node tree: 0 -> {1, 2}, 1 -> 3. Rows = query, cols = visible draft node.
    tree = torch.tensor([[1, 0, 0, 0],
                         [1, 1, 0, 0],
                         [1, 0, 1, 0],
                         [1, 1, 0, 1]], dtype=torch.bool)
    c = _extend_case(3, prefix=[6, 2], ext=[4, 4])
    mask = torch.cat([tree.flatten(), tree.flatten()])
    got = _run_extend(sgl_ops, c, tree_mask=mask)
    assert_close_report(got, _ref_extend(c, tree_mask=mask), *TOL[torch.float32], what="tree verify")
    # node 2 must not see node 1: it differs from plain causal attention
    causal = _run_extend(sgl_ops, c)
    assert not torch.allclose(got[2], causal[2])
    assert torch.allclose(got[1], causal[1], atol=1e-6)


def test_extend_bf16_close_to_fp64_reference(sgl_ops):
    c = _extend_case(4, prefix=[7, 0], ext=[3, 6], dtype=torch.bfloat16)
    got = _run_extend(sgl_ops, c)
    assert got.dtype == torch.bfloat16
    assert_close_report(got, _ref_extend(c), *TOL[torch.bfloat16], what="extend bf16")


def _decode_case(seed, seq, dtype=torch.float32):
    g, k_buf, v_buf, rtt, rpi = _setup(seed, seq, dtype)
    bsz = len(seq)
    q = torch.randn(bsz, HQ, D, generator=g).to(dtype)
    k_new = torch.randn(bsz, HKV, D, generator=g).to(dtype)
    v_new = torch.randn(bsz, HKV, DV, generator=g).to(dtype)
    loc = torch.stack([rtt[rpi[b], seq[b] - 1].long() for b in range(bsz)])
    return dict(q=q, k_new=k_new, v_new=v_new, k_buf=k_buf, v_buf=v_buf, rtt=rtt, rpi=rpi,
                seq=torch.tensor(seq, dtype=torch.int64), loc=loc)


@pytest.mark.parametrize("variant", ["plain", "logit_cap", "sinks", "window"])
def test_decode_writes_kv_then_matches_reference(sgl_ops, variant):
    c = _decode_case(5, [1, 7, 12])
    kw = {"plain": {}, "logit_cap": {"logit_cap": 1.5}, "window": {"window_plus_one": 5},
          "sinks": {"sinks": torch.linspace(0.5, -2.0, HQ)}}[variant]
    o = torch.full((3, HQ, DV), float("nan"))
    logits = torch.zeros(3, HQ, 8, DV + 1)
    sgl_ops.decode_attention_cpu(c["q"], c["k_buf"], c["v_buf"], 1.0, 1.0, o, c["k_new"], c["v_new"],
                                 c["loc"], logits, c["rtt"], c["rpi"], c["seq"], D ** -0.5,
                                 kw.get("logit_cap", 0.0), False, kw.get("window_plus_one", 0),
                                 None, kw.get("sinks"))
    assert torch.equal(c["k_buf"][c["loc"]], c["k_new"]) and torch.equal(c["v_buf"][c["loc"]], c["v_new"])
    ref = reference.decode_attention(c["q"], c["k_buf"], c["v_buf"], c["rtt"], c["rpi"], c["seq"],
                                     D ** -0.5, **kw)
    assert_close_report(o, ref, *TOL[torch.float32], what=f"decode {variant}")


def test_decode_equals_last_row_of_extend(sgl_ops, path):
    # The same token attended by decode (1 query) and by extend (last of 4) agrees in fp32;
    # through the kernel bit for bit (a row's sums do not depend on the other rows).
    c = _extend_case(6, prefix=[9], ext=[4])
    o_ext = _run_extend(sgl_ops, c)
    slots = c["rtt"][c["rpi"][0], 9:13].long()
    c["k_buf"][slots] = c["k_ext"]
    c["v_buf"][slots] = c["v_ext"]
    o_dec = torch.empty(1, HQ, DV)
    sgl_ops.decode_attention_cpu(c["q"][3:4], c["k_buf"], c["v_buf"], 1.0, 1.0, o_dec, None, None,
                                 slots[3:4], torch.zeros(1), c["rtt"], c["rpi"], c["seq"], D ** -0.5,
                                 0.0, False, 0, None, None)
    assert_close_report(o_dec[0], o_ext[3], 1e-6, 1e-6, what="decode vs extend last row")
    if path == "kernel":
        assert torch.equal(o_dec[0], o_ext[3])


def test_tree_rows_equal_decodes_over_the_keys_they_see(sgl_ops, path):
    # Served shapes (9 query / 3 KV heads, head dim 64, 37 cached keys: not a multiple of the
    # kernel's key blocks): each row of a 6-token tree verify against a one-token decode whose
    # request lists exactly the keys that row sees (the prefix, its ancestors, itself). The
    # kernel splits the two differently (blocks shared by all rows, then each row's own extend
    # keys) and must give the same bits; the torch path agrees in fp32.
    g = torch.Generator().manual_seed(21)
    hq, hkv, d, prefix, parents = 9, 3, 64, 37, [-1, 0, 0, 1, 1, 2]
    e = len(parents)
    k_buf, v_buf = torch.randn(64, hkv, d, generator=g), torch.randn(64, hkv, d, generator=g)
    rows = torch.randperm(63, generator=g)[:prefix + e] + 1
    tree = torch.zeros(e, e, dtype=torch.bool)
    for i, p in enumerate(parents):
        tree[i] = tree[p] if p >= 0 else tree[i]
        tree[i, i] = True
    q = torch.randn(e, hq, d, generator=g)
    rtt = torch.zeros(1, 64, dtype=torch.int32)
    rtt[0, :prefix + e] = rows.int()
    o = torch.full((e, hq, d), float("nan"))
    one = torch.tensor([0])
    sgl_ops.extend_attention_cpu(q, None, None, o, k_buf, v_buf, 1.0, 1.0, rtt, one,
                                 torch.tensor([prefix + e]), torch.tensor([e]), one, e, d ** -0.5,
                                 0.0, False, 0, None, None, tree.flatten(), True)
    for i in range(e):
        seen = torch.cat([rows[:prefix], rows[prefix:][tree[i]]])           # in key order
        dec_rtt = torch.zeros(1, 64, dtype=torch.int32)
        dec_rtt[0, :len(seen)] = seen.int()
        o_dec = torch.empty(1, hq, d)
        sgl_ops.decode_attention_cpu(q[i:i + 1], k_buf, v_buf, 1.0, 1.0, o_dec, None, None,
                                     seen[-1:].long(), torch.zeros(1), dec_rtt, one,
                                     torch.tensor([len(seen)]), d ** -0.5, 0.0, False, 0, None, None)
        assert_close_report(o_dec[0], o[i], 1e-6, 1e-6, what=f"tree row {i} vs its decode")
        if path == "kernel":
            assert torch.equal(o_dec[0], o[i]), f"tree row {i} differs from its decode in the last bits"


def test_kernel_odd_head_dims_int64_rows_and_extend_kv_from_cache(sgl_ops):
    """Head dims that are not a multiple of the vector width (12 / 20), int64 req_to_token,
    a tree block, a sliding window and a logit cap at once, against the reference."""
    g = torch.Generator().manual_seed(11)
    hq, hkv, d, dv, seq, ext = 4, 1, 12, 20, [9, 5], [3, 5]
    k_buf, v_buf = torch.randn(40, hkv, d, generator=g), torch.randn(40, hkv, dv, generator=g)
    rtt = torch.zeros(2, 16, dtype=torch.int64)
    rows = torch.randperm(39, generator=g)[:sum(seq)] + 1
    rtt[0, :9], rtt[1, :5] = rows[:9], rows[9:]
    rpi = torch.tensor([1, 0])
    seq_t = torch.tensor(seq[::-1])                        # request 0 -> pool row 1 (5 keys)
    ext_t, start = torch.tensor(ext[::-1]), torch.tensor([0, 5])
    n = sum(ext)
    q = torch.randn(n, hq, d, generator=g)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(5, 5, dtype=torch.bool).tril().flatten(), tree.flatten()])
    o = torch.full((n, hq, dv), float("nan"))
    sgl_ops.extend_attention_cpu(q, None, None, o, k_buf, v_buf, 1.0, 1.0, rtt, rpi, seq_t, ext_t,
                                 start, 5, d ** -0.5, 3.0, False, 4, None, None, mask, True)
    new = torch.cat([rtt[rpi[b], seq_t[b] - ext_t[b]:seq_t[b]] for b in range(2)])   # extend rows
    ref = reference.extend_attention(q, k_buf[new], v_buf[new], k_buf, v_buf, rtt, rpi, seq_t, ext_t,
                                     start, d ** -0.5, logit_cap=3.0, window_plus_one=4, tree_mask=mask)
    assert_close_report(o, ref, 2e-5, 2e-5, what="odd dims, int64 rows, tree, window, cap")


def test_cross_attention_is_refused_by_name(sgl_ops):
    c = _decode_case(7, [3])
    with pytest.raises(NotImplementedError, match="decode_attention_cpu.*cross attention"):
        sgl_ops.decode_attention_cpu(c["q"], c["k_buf"], c["v_buf"], 1.0, 1.0, torch.empty(1, HQ, DV),
                                     None, None, c["loc"], torch.zeros(1), c["rtt"], c["rpi"],
                                     c["seq"], 1.0, 0.0, True, 0, None, None)


@pytest.mark.parametrize("variant", ["plain", "window", "tree"])
def test_long_extend_sdpa_path_matches_reference(sgl_ops, monkeypatch, variant):
    # Extends with many queries x keys go through torch's fused SDPA; force it on small shapes.
    from eagle3_backend.cpu.ops import attention

    monkeypatch.setattr(attention, "SDPA_MIN_SCORES", 1)
    c = _extend_case(8, prefix=[5, 0], ext=[4, 4])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    mask = torch.cat([tree.flatten(), tree.flatten()])
    kw, ref_kw = {"plain": ({}, {}), "window": ({"window": 3}, {"window_plus_one": 3}),
                  "tree": ({"tree_mask": mask}, {"tree_mask": mask})}[variant]
    assert_close_report(_run_extend(sgl_ops, c, **kw), _ref_extend(c, **ref_kw), *TOL[torch.float32],
                        what=f"sdpa extend {variant}")
