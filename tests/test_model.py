"""Tests of the EAGLE-3 draft config and model (eagle3_backend/config.py, model.py).

The model is checked against an independent re-derivation of the EAGLE-3 step written
here with explicit matmuls and softmax (``ref_forward``), against itself across
cache / no-cache / tree paths, and (marker ``sglang``) against the parameter names
SGLang 0.5.23's ``LlamaForCausalLMEagle3`` loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from eagle3_backend.config import DraftConfig, RopeScaling
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout
from eagle3_backend.model import (
    DraftKVCache,
    Eagle3DraftModel,
    propose_chain,
    rope_inv_freq,
    tree_attention_mask,
)

REPO = Path(__file__).resolve().parents[1]

H, HT, K, V, VD = 32, 24, 3, 50, 20


def small_cfg(**kw) -> DraftConfig:
    base = dict(hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=V, draft_vocab_size=VD, target_hidden_size=HT,
                layout="[embed, layer_input:2, layer_input:5]", dtype="float32")
    base.update(kw)
    return DraftConfig(**base)


def inputs(cfg: DraftConfig, B=2, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    tgt = torch.randn(B, T, cfg.fc_in_features, generator=g)
    return ids, tgt


# ------------------------------------------------------------------ reference
def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_project(m: Eagle3DraftModel, tgt):
    cfg, sd = m.config, {k: v.double() for k, v in m.state_dict().items() if v.is_floating_point()}
    x = tgt.double()
    if cfg.norm_before_fc:
        x = rms(x, sd["input_norm.weight"], cfg.rms_norm_eps)
    if cfg.fc_norm:
        x = torch.cat([rms(x[..., i * HT:(i + 1) * HT], sd[f"fc_norm.{i}.weight"], cfg.rms_norm_eps)
                       for i in range(len(cfg.layout))], dim=-1)
    x = x @ sd["fc.weight"].T
    return x + sd["fc.bias"] if cfg.fc_bias else x


def ref_forward(m: Eagle3DraftModel, ids, hidden, projected=False, positions=None, embed=None):
    """EAGLE-3 step from its definition, fp64, causal over the given tokens only."""
    cfg = m.config
    sd = {k: v.double() for k, v in m.state_dict().items() if v.is_floating_point()}
    eps, nh, nkv, D = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    B, T = ids.shape
    h = hidden.double() if projected else ref_project(m, hidden)
    E = embed.double() if embed is not None else sd["embed_tokens.weight"]
    emb = E[ids]
    hn = rms(h, sd["midlayer.hidden_norm.weight"], eps)
    res = hn if cfg.norm_before_residual else h
    x = torch.cat([rms(emb, sd["midlayer.input_layernorm.weight"], eps), hn], dim=-1)
    pos = torch.arange(T).expand(B, T) if positions is None else positions
    ang = pos.double()[..., None] * rope_inv_freq(D, cfg.rope_theta, cfg.rope_scaling).double()
    scale = cfg.rope_scaling.attention_scale if cfg.rope_scaling else 1.0  # yarn's; checked in test_rope
    cos = torch.cat([ang.cos()] * 2, -1)[:, :, None] * scale
    sin = torch.cat([ang.sin()] * 2, -1)[:, :, None] * scale

    def rot(t):  # rotate_half formulation
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    def attn(x, a):  # causal self-attention of parameters ``a`` (a prefix) over x
        q = (x @ sd[a + "q_proj.weight"].T).view(B, T, nh, D)
        k = (x @ sd[a + "k_proj.weight"].T).view(B, T, nkv, D)
        v = (x @ sd[a + "v_proj.weight"].T).view(B, T, nkv, D)
        q, k = rot(q), rot(k)
        k, v = k.repeat_interleave(nh // nkv, dim=2), v.repeat_interleave(nh // nkv, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(B, T, nh * D)
        return o @ sd[a + "o_proj.weight"].T

    def mlp(x, p):  # SwiGLU MLP of layer prefix p on the normed x
        y = rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        y = torch.nn.functional.silu(y @ sd[p + "mlp.gate_proj.weight"].T) * (y @ sd[p + "mlp.up_proj.weight"].T)
        return y @ sd[p + "mlp.down_proj.weight"].T

    x = attn(x, "midlayer.self_attn.") + res
    out = mlp(x, "midlayer.") + x
    for n in range(1, cfg.num_hidden_layers):  # SGLang's layers 1+: input normed by hidden_norm
        p = f"layers.{n}."
        out = attn(rms(out, sd[p + "hidden_norm.weight"], eps), p + "self_attn.") + out
        out = mlp(out, p) + out
    normed = rms(out, sd["norm.weight"], eps)
    head = E if cfg.tie_word_embeddings else sd["lm_head.weight"]
    return normed @ head.T, (normed if cfg.norm_output else out)


def assert_close(a, b, atol=2e-5, rtol=2e-5):
    torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=rtol)


# ------------------------------------------------------------------ config
def test_config_resolves_and_derives():
    cfg = small_cfg()
    assert cfg.head_dim == H // 4
    assert cfg.fc_in_features == 3 * HT == 72
    assert cfg.layout == Layout.parse(["embed", "layer_input:2", "layer_input:5"])
    assert cfg.torch_dtype is torch.float32 and cfg.uses_vocab_map
    assert hash(cfg) == hash(small_cfg()) and cfg == small_cfg()
    assert small_cfg(head_dim=16).head_dim == 16
    rs = small_cfg(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4, "original_max_position_embeddings": 8192})
    assert rs.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert small_cfg(rope_scaling={"type": "default"}).rope_scaling is None
    hash(rs)


@pytest.mark.parametrize("kw, needle", [
    (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads (3)"),
    (dict(draft_vocab_size=V + 1), f"draft_vocab_size {V + 1} exceeds the target vocab_size {V}"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings needs draft_vocab_size == vocab_size"),
    (dict(has_embed_tokens=False), "hidden_size 32 differs from target_hidden_size 24"),
    (dict(dtype="fp8"), "'fp8' is not supported"),
    (dict(hidden_act="gelu"), "'gelu' is not supported"),
    (dict(hidden_size=30), "not divisible by num_attention_heads 4"),
    (dict(head_dim=7), "head_dim must be even"),
    (dict(hidden_size=0), "hidden_size must be a positive integer, got 0"),
    (dict(fc_norm=1), "fc_norm must be True or False"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 4.0}), "'longrope' is not supported"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 0.5}), "factor must be a number >= 1"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "lacks ['low_freq_factor'"),
    (dict(layout="[embed, embed]"), "names embed twice"),
])
def test_config_rejects(kw, needle):
    with pytest.raises(Eagle3Error) as e:
        small_cfg(**kw)
    assert needle in str(e.value)


# ------------------------------------------------------------------ names, shapes, dtypes
CORE_KEYS = {
    "fc.weight", "embed_tokens.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
}


def test_state_dict_names_and_shapes():
    m = Eagle3DraftModel(small_cfg())
    sd = m.state_dict()
    assert set(sd) == CORE_KEYS
    assert sd["fc.weight"].shape == (H, 72)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (4 * 8, 2 * H)
    assert sd["midlayer.self_attn.k_proj.weight"].shape == (2 * 8, 2 * H)
    assert sd["lm_head.weight"].shape == (VD, H)
    assert sd["embed_tokens.weight"].shape == (V, H)
    assert sd["d2t"].dtype == torch.int64 and sd["d2t"].shape == (VD,)
    assert sd["t2d"].dtype == torch.bool and sd["t2d"].shape == (V,)

    v = Eagle3DraftModel(small_cfg(fc_bias=True, norm_before_fc=True, fc_norm=True))
    assert set(v.state_dict()) == CORE_KEYS | {"fc.bias", "input_norm.weight", "fc_norm.0.weight",
                                               "fc_norm.1.weight", "fc_norm.2.weight"}
    assert v.state_dict()["input_norm.weight"].shape == (72,)
    assert v.state_dict()["fc_norm.2.weight"].shape == (HT,)
    t = Eagle3DraftModel(small_cfg(draft_vocab_size=V, tie_word_embeddings=True))
    assert set(t.state_dict()) == CORE_KEYS - {"lm_head.weight"}
    n = Eagle3DraftModel(small_cfg(target_hidden_size=H, has_embed_tokens=False))
    assert set(n.state_dict()) == CORE_KEYS - {"embed_tokens.weight"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_shapes_and_dtypes(dtype):
    cfg = small_cfg(dtype=dtype)
    m = Eagle3DraftModel.init_random(cfg, seed=0)
    ids, tgt = inputs(cfg, B=2, T=5)
    logits, nxt = m(ids, tgt)
    want = cfg.torch_dtype
    assert logits.shape == (2, 5, VD) and logits.dtype == want
    assert nxt.shape == (2, 5, H) and nxt.dtype == want
    assert m.project(tgt[0]).shape == (5, H)  # [T, K*Ht] -> [T, H]
    assert all(p.dtype == want for p in m.parameters())
    assert m.d2t.dtype == torch.int64 and m.t2d.dtype == torch.bool
    toks = propose_chain(m, ids, tgt, None, None, num_steps=3)
    assert toks.shape == (2, 3) and toks.dtype == torch.int64
    assert bool(m.t2d[toks].all())  # every drafted token lies in the draft vocabulary


def test_init_random_is_deterministic():
    cfg = small_cfg()
    a, b, c = (Eagle3DraftModel.init_random(cfg, seed=s) for s in (3, 3, 4))
    for k, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[k]), k
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_bf16_tracks_fp32():
    m32 = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    m16 = Eagle3DraftModel.init_random(small_cfg(dtype="bfloat16"), seed=0)
    ids, tgt = inputs(m32.config)
    l32, _ = m32(ids, tgt)
    l16, _ = m16(ids, tgt)
    cos = torch.nn.functional.cosine_similarity(l16.float().flatten(), l32.flatten(), dim=0)
    assert cos > 0.999, cos
    assert (l16.float() - l32).abs().max() < 0.1 * l32.abs().max()


# ------------------------------------------------------------------ definition of each variant
def test_base_matches_reference():
    m = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    ids, tgt = inputs(m.config)
    logits, nxt = m(ids, tgt)
    rl, rn = ref_forward(m, ids, tgt)
    assert_close(logits, rl)
    assert_close(nxt, rn)


VARIANTS = [
    (dict(num_hidden_layers=3), {f"layers.{n}.{k}" for n in (1, 2) for k in (
        "hidden_norm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")}),
    (dict(fc_bias=True), {"fc.bias"}),
    (dict(norm_before_fc=True), {"input_norm.weight"}),
    (dict(fc_norm=True), {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}),
    (dict(norm_before_residual=True), set()),
    (dict(norm_output=True), set()),
    (dict(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16)), set()),
    (dict(rope_scaling=RopeScaling(4.0, original_max_position_embeddings=16, rope_type="yarn")),
     set()),
    (dict(rope_theta=500000.0), set()),
    (dict(num_key_value_heads=4), set()),
]


@pytest.mark.parametrize("kw, new_keys", VARIANTS, ids=lambda x: str(x) if isinstance(x, dict) else "")
def test_variant_follows_definition_and_changes_output(kw, new_keys):
    base = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    var = Eagle3DraftModel.init_random(small_cfg(**kw), seed=1)
    same = {k: v for k, v in base.state_dict().items() if var.state_dict()[k].shape == v.shape}
    missing, unexpected = var.load_state_dict(same, strict=False)
    assert set(missing) == new_keys | (set(var.state_dict()) - set(same))
    assert not unexpected
    ids, tgt = inputs(base.config, T=20)
    pos = torch.arange(20).expand(2, 20) * 7  # large positions so rope scaling matters
    lb, nb = base(ids, tgt, pos)
    lv, nv = var(ids, tgt, pos)
    rl, rn = ref_forward(var, ids, tgt, positions=pos)
    assert_close(lv, rl, atol=1e-4, rtol=1e-4)
    assert_close(nv, rn, atol=1e-4, rtol=1e-4)
    if kw == dict(norm_output=True):
        assert torch.equal(lv, lb)  # only the hidden handed on changes
        assert_close(nv, var.norm(nb))
        assert not torch.allclose(nv, nb)
    else:
        assert (lv - lb).abs().max() > 1e-3


def test_fc_norm_is_per_chunk():
    m = Eagle3DraftModel.init_random(small_cfg(fc_norm=True, fc_bias=True), seed=2)
    _, tgt = inputs(m.config)
    tgt[..., HT:2 * HT] *= 100.0  # a chunk of another scale: per-chunk norm removes it
    chunks = [m.fc_norm[i](tgt[..., i * HT:(i + 1) * HT]) for i in range(3)]
    manual = torch.cat(chunks, -1) @ m.fc.weight.T + m.fc.bias
    assert_close(m.project(tgt), manual)
    whole = Eagle3DraftModel.init_random(small_cfg(norm_before_fc=True), seed=2)
    assert_close(whole.project(tgt), ref_project(whole, tgt))


def test_tied_lm_head_shares_embedding():
    m = Eagle3DraftModel.init_random(small_cfg(draft_vocab_size=V, tie_word_embeddings=True), seed=0)
    assert not hasattr(m, "lm_head")
    assert m.head_weight.data_ptr() == m.embed_tokens.weight.data_ptr()
    ids, tgt = inputs(m.config)
    logits, _ = m(ids, tgt)
    assert logits.shape[-1] == V
    assert_close(logits, ref_forward(m, ids, tgt)[0])


def test_target_embedding_is_used_and_shared():
    cfg = small_cfg(target_hidden_size=H, has_embed_tokens=False)
    m = Eagle3DraftModel.init_random(cfg, seed=0)
    ids, tgt = inputs(cfg)
    with pytest.raises(Eagle3Error, match="set_target_embedding"):
        m(ids, tgt)
    with pytest.raises(Eagle3Error, match=r"shape \(50, 31\), the draft expects \(50, 32\)"):
        m.set_target_embedding(torch.zeros(V, H - 1))
    emb = torch.randn(V, H, generator=torch.Generator().manual_seed(5))
    m.set_target_embedding(emb)
    assert m.embedding_weight.data_ptr() == emb.data_ptr()
    assert "target_embedding" not in m.state_dict()
    logits, nxt = m(ids, tgt)
    rl, rn = ref_forward(m, ids, tgt, embed=emb)
    assert_close(logits, rl)
    # the same weights carried as the draft's own embedding give the same result
    own = Eagle3DraftModel(dataclasses.replace(cfg, has_embed_tokens=True))
    own.load_state_dict({**m.state_dict(), "embed_tokens.weight": emb})
    assert_close(own(ids, tgt)[0], logits, atol=0, rtol=0)
    # target embedding takes precedence over the draft's own one (SGLang set_embed)
    own.set_target_embedding(emb * 2)
    assert not torch.allclose(own(ids, tgt)[0], logits)


def test_vocab_map_exact():
    m = Eagle3DraftModel(small_cfg())
    ids = torch.tensor([1, 3, 4, 8, 9, 10, 11, 15, 17, 20, 21, 22, 30, 31, 33, 40, 41, 45, 48, 49])
    m.set_vocab_map(ids)
    assert m.d2t.tolist() == (ids - torch.arange(VD)).tolist()
    assert m.d2t[:4].tolist() == [1, 2, 2, 5]
    assert torch.equal(m.draft_to_target(torch.arange(VD)), ids)
    assert torch.equal(m.draft_to_target(torch.tensor([[0, 19], [3, 3]])), torch.tensor([[1, 49], [8, 8]]))
    assert torch.equal(m.t2d.nonzero().flatten(), ids)
    for bad in (ids[:-1], torch.cat([ids[:-1], ids[:1]]), torch.cat([ids[:-1], torch.tensor([V])])):
        with pytest.raises(Eagle3Error, match="20 distinct target ids in"):
            m.set_vocab_map(bad)
    r = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    tgt_ids = r.draft_to_target(torch.arange(VD))
    assert (tgt_ids.diff() > 0).all() and tgt_ids.max() < V
    assert r.t2d.sum() == VD and r.t2d[tgt_ids].all()
    assert not torch.equal(tgt_ids, torch.arange(VD))  # a real subset map, not identity


def test_rejects_bad_hidden_and_mask():
    m = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    ids, tgt = inputs(m.config)
    with pytest.raises(Eagle3Error, match=r"3 x 24 = 72 inputs \(layout \[embed, layer_input:2, layer_input:5\]\), got 71"):
        m(ids, tgt[..., :-1])
    with pytest.raises(Eagle3Error, match=r"attn_mask must be bool \[B, 6, 6\]"):
        m(ids, tgt, attn_mask=torch.ones(6, 7, dtype=torch.bool))
    amb = Eagle3DraftModel.init_random(small_cfg(target_hidden_size=H, layout="[layer_input:3]"), seed=0)
    with pytest.raises(Eagle3Error, match="pass projected=True"):
        amb(ids, torch.randn(2, 6, H))
    x = torch.randn(2, 6, H)
    assert_close(amb(ids, x, projected=False)[0], ref_forward(amb, ids, x)[0])
    assert_close(amb(ids, x, projected=True)[0], ref_forward(amb, ids, x, projected=True)[0])
    cache = m.new_cache(2, 4)
    with pytest.raises(Eagle3Error, match="exceed max_len 4"):
        m(ids, tgt, cache=cache)


# ------------------------------------------------------------------ rope
def test_llama3_inv_freq_hand_computed():
    # head_dim 8, theta 1e4: base inv_freq = 1, 0.1, 0.01, 0.001 (wavelengths 2pi/f).
    # factor 8, low 1, high 4, original 1024: low_wavelen 1024, high_wavelen 256.
    #   6.28, 62.8 < 256 -> kept; 6283 > 1024 -> 0.001 / 8;
    #   628.3 in between -> s = (1024 / 628.3185 - 1) / 3, f = (1 - s) * 0.01 / 8 + s * 0.01
    s = (1024 / (2 * math.pi / 0.01) - 1) / 3
    assert abs(s - 0.2099155) < 1e-6
    want = torch.tensor([1.0, 0.1, (1 - s) * 0.01 / 8 + s * 0.01, 0.000125], dtype=torch.float64)
    got = rope_inv_freq(8, 10000.0, RopeScaling(8.0, 1.0, 4.0, 1024))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(rope_inv_freq(8, 10000.0, None).double(),
                               torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64), rtol=1e-6, atol=0)


def test_llama3_inv_freq_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    hf = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0,
                     rope_scaling=sc, max_position_embeddings=131072)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    got = rope_inv_freq(128, 500000.0, RopeScaling.from_dict(sc))
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)


def test_bf16_model_keeps_fp32_rope():
    m = Eagle3DraftModel.init_random(small_cfg(dtype="bfloat16"), seed=0)
    assert m.midlayer.self_attn._inv_freq.dtype == torch.float32


# ------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("layers", [1, 2])
def test_incremental_cache_equals_full_recompute(layers):
    m = Eagle3DraftModel.init_random(small_cfg(num_hidden_layers=layers), seed=0)
    ids, tgt = inputs(m.config, B=2, T=9)
    h = m.project(tgt)
    full_l, full_h = m(ids, h, projected=True)
    cache = m.new_cache(2, 16)
    outs = []
    for a, b in ((0, 4), (4, 5), (5, 6), (6, 9)):
        outs.append(m(ids[:, a:b], h[:, a:b], cache=cache, projected=True))
        assert cache.length == b
    assert_close(torch.cat([o[0] for o in outs], 1), full_l, atol=1e-5, rtol=1e-5)
    assert_close(torch.cat([o[1] for o in outs], 1), full_h, atol=1e-5, rtol=1e-5)


def naive_chain(m, ids, tgt, num_steps):
    """Greedy chain without a cache: re-run the whole growing sequence at every step."""
    seq_ids, seq_h, toks = ids, m.project(tgt), []
    for _ in range(num_steps):
        logits, nxt = m(seq_ids, seq_h, projected=True)
        tok = m.draft_to_target(logits[:, -1].argmax(-1))
        toks.append(tok)
        seq_ids = torch.cat([seq_ids, tok[:, None]], 1)
        seq_h = torch.cat([seq_h, nxt[:, -1:]], 1)
    return torch.stack(toks, 1)


@pytest.mark.parametrize("kw", [{}, dict(norm_output=True, fc_norm=True, norm_before_residual=True),
                                dict(num_hidden_layers=2)])
def test_propose_chain_equals_naive(kw):
    m = Eagle3DraftModel.init_random(small_cfg(**kw), seed=0)
    ids, tgt = inputs(m.config, B=3, T=7)
    cache = m.new_cache(3, 32)
    toks, logits = propose_chain(m, ids, tgt, None, cache, num_steps=5, return_logits=True)
    assert cache.length == 7 + 4  # the last drafted token is not run
    assert torch.equal(toks, naive_chain(m, ids, tgt, 5))
    assert logits.shape == (3, 5, VD)
    assert len(set(toks.flatten().tolist())) > 1  # not a degenerate constant chain


def test_propose_chain_continues_after_prefix():
    m = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    ids, tgt = inputs(m.config, B=1, T=8)
    cache = m.new_cache(1, 32)
    m(ids[:, :5], tgt[:, :5], cache=cache)
    toks = propose_chain(m, ids[:, 5:], tgt[:, 5:], None, cache, num_steps=3)
    assert torch.equal(toks, naive_chain(m, ids, tgt, 3))


def test_crop_then_reappend_equals_fresh():
    m = Eagle3DraftModel.init_random(small_cfg(), seed=0)
    ids, tgt = inputs(m.config, B=2, T=10)
    h = m.project(tgt)
    cache = m.new_cache(2, 16)
    m(ids[:, :6], h[:, :6], cache=cache, projected=True)
    m(ids[:, 6:9].flip(0), h[:, 6:9] * 3, cache=cache, projected=True)  # rejected drafts
    cache.crop(6)
    got = m(ids[:, 6:], h[:, 6:], cache=cache, projected=True)
    fresh = m.new_cache(2, 16)
    m(ids[:, :6], h[:, :6], cache=fresh, projected=True)
    want = m(ids[:, 6:], h[:, 6:], cache=fresh, projected=True)
    assert_close(got[0], want[0], atol=1e-6, rtol=1e-6)
    assert cache.length == 10
    with pytest.raises(Eagle3Error, match="to 11"):
        cache.crop(11)


# ------------------------------------------------------------------ tree drafting
def test_tree_mask_shape_and_ancestry():
    mask = tree_attention_mask([-1, -1, 0, 1, 2], prefix_len=2).int()
    assert mask.tolist() == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0, 1, 0],
        [1, 1, 1, 0, 1, 0, 1],
    ]
    with pytest.raises(Eagle3Error, match="parent 3"):
        tree_attention_mask([-1, 3], 0)


@pytest.mark.parametrize("layers", [1, 2])
def test_tree_forward_equals_chains_per_branch(layers):
    """One masked forward over a whole tree = a chain forward down each branch."""
    m = Eagle3DraftModel.init_random(small_cfg(num_hidden_layers=layers), seed=0)
    ids, tgt = inputs(m.config, B=1, T=5)
    g = torch.Generator().manual_seed(9)
    parents = [-1, -1, 0, 0, 1, 2]          # depth-3 tree, 6 nodes
    depth = [0, 0, 1, 1, 1, 2]
    node_ids = torch.randint(0, V, (1, 6), generator=g)
    node_h = torch.randn(1, 6, H, generator=g)
    cache = m.new_cache(1, 16)
    m(ids, tgt, cache=cache)
    P = cache.length
    pos = torch.tensor([[P + d for d in depth]])
    tl, th = m(node_ids, node_h, pos, cache, attn_mask=tree_attention_mask(parents, P)[None], projected=True)
    for leaf in (3, 4, 5):
        path, n = [], leaf
        while n >= 0:
            path.insert(0, n)
            n = parents[n]
        c = m.new_cache(1, 16)
        m(ids, tgt, cache=c)
        cl, ch = m(node_ids[:, path], node_h[:, path], cache=c, projected=True)
        assert_close(tl[:, path], cl, atol=1e-5, rtol=1e-5)
        assert_close(th[:, path], ch, atol=1e-5, rtol=1e-5)


def test_topk_tree_drafting_level_by_level():
    """SGLang-style top-k drafting: each level attends prefix + its ancestors in the cache."""
    m = Eagle3DraftModel.init_random(small_cfg(), seed=1)
    ids, tgt = inputs(m.config, B=1, T=5)
    topk = 2
    cache = m.new_cache(1, 32)
    logits, hid = m(ids, tgt, cache=cache)
    P = cache.length
    top = logits[:, -1].topk(topk, -1).indices[0]                  # level 1: 2 nodes
    lvl1_ids = m.draft_to_target(top)[None]
    lvl1_h = hid[:, -1:].expand(1, topk, H)
    parents = [-1, -1, 0, 0, 1, 1]                                   # level 2: 2 children each
    full = tree_attention_mask(parents, P)
    l1, h1 = m(lvl1_ids, lvl1_h, torch.full((1, topk), P), cache,
               attn_mask=full[:2, : P + 2][None], projected=True)
    lvl2 = torch.stack([l1[0, i].topk(topk).indices for i in range(topk)]).flatten()
    lvl2_ids = m.draft_to_target(lvl2)[None]
    lvl2_h = h1[:, [0, 0, 1, 1]]
    l2, _ = m(lvl2_ids, lvl2_h, torch.full((1, 4), P + 1), cache,
              attn_mask=full[2:, : P + 6][None], projected=True)
    for j in range(4):
        b = j // 2
        c = m.new_cache(1, 32)
        m(ids, tgt, cache=c)
        chain_ids = torch.stack([lvl1_ids[0, b], lvl2_ids[0, j]])[None]
        chain_h = torch.cat([lvl1_h[:, b:b + 1], lvl2_h[:, j:j + 1]], 1)
        cl, _ = m(chain_ids, chain_h, cache=c, projected=True)
        assert_close(l1[:, b], cl[:, 0], atol=1e-5, rtol=1e-5)
        assert_close(l2[:, j], cl[:, 1], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_matches_cpu(dtype):
    cfg = small_cfg(dtype=dtype)
    cpu = Eagle3DraftModel.init_random(cfg, seed=0)
    gpu = Eagle3DraftModel.init_random(cfg, seed=0, device="cuda")
    ids, tgt = inputs(cfg)
    lc, _ = cpu(ids, tgt)
    lg, _ = gpu(ids.cuda(), tgt.cuda())
    tol = 1e-4 if dtype == "float32" else 5e-2
    torch.testing.assert_close(lg.float().cpu(), lc.float(), atol=tol * lc.abs().max().item(), rtol=tol)
    if dtype == "float32":  # bf16 rounding may flip a near-tie argmax; fp32 must not
        assert torch.equal(propose_chain(gpu, ids.cuda(), tgt.cuda(), None, None, 4).cpu(),
                           propose_chain(cpu, ids, tgt, None, None, 4))


# ------------------------------------------------------------------ SGLang names
_SGLANG_SCRIPT = textwrap.dedent('''
    import json, sys, types
    import torch
    # sglang's rotary base class imports vllm's op on a CPU-only, non-CPU-engine build;
    # the model is only constructed here, never run, so a placeholder is enough.
    vm, co = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    co.rotary_embedding = None
    vm._custom_ops = co
    sys.modules.update({"vllm": vm, "vllm._custom_ops": co})
    from transformers import LlamaConfig
    from sglang.test.layer_ut_utils import init_single_process_dist
    init_single_process_dist(master_port=int(sys.argv[2]))
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from safetensors.torch import load_file
    job = json.loads(open(sys.argv[1]).read())
    results = []
    for case in job:
        m = LlamaForCausalLMEagle3(LlamaConfig(**case["config"]))
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(float("nan"))
        sd = load_file(case["weights"])
        m.load_weights(list(sd.items()))
        loaded = sorted(n for n, p in m.named_parameters() if not torch.isnan(p).any())
        unloaded = sorted(n for n, p in m.named_parameters() if torch.isnan(p).all())
        q = sd["midlayer.self_attn.q_proj.weight"]; k = sd["midlayer.self_attn.k_proj.weight"]
        v = sd["midlayer.self_attn.v_proj.weight"]
        qkv_ok = torch.equal(m.model.layers[0].self_attn.qkv_proj.weight, torch.cat([q, k, v]))
        fc_ok = torch.equal(m.model.fc.weight, sd["fc.weight"])
        hot = m.get_hot_token_id()
        hot_ok = torch.equal(hot, sd["d2t"] + torch.arange(sd["d2t"].numel()))
        upper_qkv_ok = len(m.model.layers) < 2 or torch.equal(
            m.model.layers[1].self_attn.qkv_proj.weight,
            torch.cat([sd[f"layers.1.self_attn.{x}_proj.weight"] for x in "qkv"]))
        results.append(dict(loaded=loaded, unloaded=unloaded, qkv_ok=qkv_ok, fc_ok=fc_ok, hot_ok=hot_ok,
                            upper_qkv_ok=upper_qkv_ok))
    print("RESULT " + json.dumps(results))
''')


def _sglang_config(cfg: DraftConfig) -> dict:
    return dict(
        architectures=["LlamaForCausalLMEagle3"], hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        num_hidden_layers=cfg.num_hidden_layers,
        vocab_size=cfg.vocab_size, draft_vocab_size=cfg.draft_vocab_size,
        target_hidden_size=cfg.target_hidden_size, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, bias=cfg.fc_bias, fc_norm=cfg.fc_norm,
        norm_output=cfg.norm_output, torch_dtype="float32",
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 7][: len(cfg.layout)],
                      "norm_before_fc": cfg.norm_before_fc},
    )


@pytest.mark.sglang
@pytest.mark.slow
def test_state_dict_is_what_sglang_loads(tmp_path):
    pytest.importorskip("sglang")
    from safetensors.torch import save_file

    cases = {
        "base": small_cfg(),
        "fc variants": small_cfg(fc_bias=True, norm_before_fc=True, fc_norm=True),
        "tied": small_cfg(draft_vocab_size=V, tie_word_embeddings=True),
        "target embedding": small_cfg(target_hidden_size=H, has_embed_tokens=False),
        "two layers": small_cfg(num_hidden_layers=2),
    }
    job = []
    for i, (name, cfg) in enumerate(cases.items()):
        m = Eagle3DraftModel.init_random(cfg, seed=i)
        path = tmp_path / f"{i}.safetensors"
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
        job.append(dict(config=_sglang_config(cfg), weights=str(path)))
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "run.py").write_text(_SGLANG_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    port = str(29500 + os.getpid() % 400)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "job.json"), port],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, f"sglang construction failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = dict(zip(cases, json.loads(line[0][len("RESULT "):])))

    core = {"model.fc.weight", "model.norm.weight", "model.layers.0.self_attn.qkv_proj.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
            "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight", "model.layers.0.hidden_norm.weight"}
    assert set(results["base"]["loaded"]) == core | {"model.embed_tokens.weight", "lm_head.weight"}
    assert results["base"]["unloaded"] == []
    fcv = results["fc variants"]
    # sglang's `bias` flag also gives o_proj a zero-initialised bias no checkpoint carries
    assert set(fcv["unloaded"]) == {"model.layers.0.self_attn.o_proj.bias"}
    assert set(fcv["loaded"]) == core | {"model.embed_tokens.weight", "lm_head.weight", "model.fc.bias",
                                         "model.input_norm.weight", "model.fc_norm.0.weight",
                                         "model.fc_norm.1.weight", "model.fc_norm.2.weight"}
    assert set(results["tied"]["loaded"]) == core | {"model.embed_tokens.weight"}
    assert results["tied"]["unloaded"] == []
    # the target's embedding is attached at run time by set_embed
    assert results["target embedding"]["unloaded"] == ["model.embed_tokens.weight"]
    upper = {f"model.layers.1.{n}" for n in (
        "self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
        "mlp.down_proj.weight", "post_attention_layernorm.weight", "hidden_norm.weight")}
    two = results["two layers"]
    assert set(two["loaded"]) == core | upper | {"model.embed_tokens.weight", "lm_head.weight"}
    # SGLang builds an input_layernorm in layer 1 too but normalises with hidden_norm there
    assert two["unloaded"] == ["model.layers.1.input_layernorm.weight"]
    assert two["upper_qkv_ok"]
    for name, r in results.items():
        assert r["qkv_ok"] and r["fc_ok"] and r["hot_ok"], name
