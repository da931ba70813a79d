"""The layer kernels (eagle3_backend/cpu/kernels/layer_ops.cpp via cpu.layer_ops) against
SGLang's own layers' native forwards and an fp64 reference: RMSNorm with and without the
residual (fp32, bf16, strided rows), SiLU-and-mul, rotary (neox and GPT-J, partial rotary
dims, offsets, strided query / key views), rows independent bit for bit; fuse_model fuses
exactly the plain layers, leaves pinned ones, and falls back per call."""

from __future__ import annotations

import pytest
import torch

from cpu_testutil import assert_close_report
from eagle3_backend.cpu import layer_ops


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _norm(hidden=576, eps=1e-5, seed=0):
    from sglang.srt.layers.layernorm import RMSNorm

    layer = RMSNorm(hidden, eps=eps)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(hidden, generator=_gen(seed)) * 2 + 0.2)
    return layer


def _norm_fp64(x, w, eps, residual=None):
    s = x.double() + (residual.double() if residual is not None else 0)
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.double(), s


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows", [1, 4, 37])
def test_rms_norm_equals_sglang_native_and_fp64(kernel, with_residual, rows):
    layer = _norm()
    x = torch.randn(rows, 576, generator=_gen(rows)) * 3
    res = torch.randn(rows, 576, generator=_gen(rows + 1)) if with_residual else None
    got = layer_ops.rms_norm(layer, kernel, x, res)
    native = layer.forward_native(x, res)
    ref, ref_sum = _norm_fp64(x, layer.weight, layer.variance_epsilon, res)
    if with_residual:
        assert torch.equal(got[1], native[1]), "the next residual is x + residual, exactly"
        assert_close_report(got[1], ref_sum, 0, 1e-6, what="residual sum")
        got, native = got[0], native[0]
    assert_close_report(got, ref, 1e-5, 1e-5, what=f"rms_norm {rows} rows vs fp64")
    assert_close_report(got, native, 1e-5, 1e-5, what=f"rms_norm {rows} rows vs SGLang native")
    assert x.shape == got.shape and got.is_contiguous()


def test_rms_norm_bf16_and_strided_rows(kernel):
    layer = _norm(seed=3)
    wide = torch.randn(5, 2 * 576, generator=_gen(9))
    x = wide[:, 576:]                                 # rows with a stride of 2 x 576
    got = layer_ops.rms_norm(layer, kernel, x)
    assert_close_report(got, layer.forward_native(x), 1e-5, 1e-5, what="strided rows")
    xb, rb = x.bfloat16(), torch.randn(5, 576, generator=_gen(10)).bfloat16()
    out, res = layer_ops.rms_norm(layer, kernel, xb, rb)
    n_out, n_res = layer.forward_native(xb, rb)
    assert out.dtype == res.dtype == torch.bfloat16
    assert torch.equal(res, n_res)
    # both round the same fp32 value to bf16 except where fp32 summation order moves it across
    # a rounding boundary: at most one bf16 step, rarely
    diff = (out.float() - n_out.float()).abs() > 0
    assert diff.float().mean() < 0.01, f"{int(diff.sum())} of {diff.numel()} bf16 outputs differ"
    assert_close_report(out.float(), n_out.float(), 1e-2, 1e-2, what="bf16 rms_norm")


def test_rms_norm_rows_do_not_depend_on_the_call(kernel):
    layer = _norm(seed=5)
    x = torch.randn(20, 576, generator=_gen(11))
    r = torch.randn(20, 576, generator=_gen(12))
    many, many_res = layer_ops.rms_norm(layer, kernel, x, r)
    for i in (0, 7, 19):
        one, one_res = layer_ops.rms_norm(layer, kernel, x[i:i + 1], r[i:i + 1])
        assert torch.equal(many[i:i + 1], one) and torch.equal(many_res[i:i + 1], one_res), i


def test_rms_norm_falls_back_to_native_for_what_it_does_not_take(kernel):
    layer = _norm(seed=6)
    x = torch.randn(3, 576, generator=_gen(13))
    r = torch.randn(3, 576, generator=_gen(14))
    extra = torch.randn(3, 576, generator=_gen(15))
    got = layer_ops.rms_norm(layer, kernel, x, r, post_residual_addition=extra)
    native = layer.forward_native(x, r, extra)
    assert torch.equal(got[0], native[0]) and torch.equal(got[1], native[1])
    x16 = x.half()
    assert torch.equal(layer_ops.rms_norm(layer, kernel, x16), layer.forward_native(x16))
    with pytest.raises(ValueError, match="hidden_size"):  # native's own error, unchanged
        layer_ops.rms_norm(layer, kernel, torch.randn(2, 100))


def test_silu_and_mul_equals_sglang_native(kernel):
    from sglang.srt.layers.activation import SiluAndMul

    layer = SiluAndMul()
    x = torch.randn(2, 3, 2 * 1536, generator=_gen(16)) * 4
    got = layer_ops.silu_and_mul(layer, kernel, x)
    xd = x.double()
    ref = torch.nn.functional.silu(xd[..., :1536]) * xd[..., 1536:]
    assert got.shape == (2, 3, 1536)
    assert_close_report(got, ref, 1e-5, 1e-5, what="silu_and_mul vs fp64")
    assert_close_report(got, layer.forward_native(x), 1e-5, 1e-5, what="silu_and_mul vs native")
    rows = x.reshape(6, -1)
    assert torch.equal(layer_ops.silu_and_mul(layer, kernel, rows)[4:5],
                       layer_ops.silu_and_mul(layer, kernel, rows[4:5]))


@pytest.mark.parametrize("d", [13, 1, 8])
def test_silu_and_mul_vector_lanes_tail_and_extremes(kernel, d):
    """Eight lanes at a time plus a scalar tail (d = 13: one vector, five in the tail), and
    inputs far out in both directions: silu's e^-|g| never overflows, so no inf or NaN."""
    from sglang.srt.layers.activation import SiluAndMul

    g = torch.linspace(-120.0, 120.0, 7 * d).view(7, d)
    u = torch.linspace(-3.0, 2.0, 7 * d).view(7, d)
    got = layer_ops.silu_and_mul(SiluAndMul(), kernel, torch.cat([g, u], dim=-1))
    ref = torch.nn.functional.silu(g.double()) * u.double()
    assert torch.isfinite(got).all()
    assert_close_report(got, ref, 1e-30, 1e-5, what=f"silu_and_mul vs fp64, d={d}")


@pytest.fixture(autouse=True)
def cpu_engine(monkeypatch):
    """Layers built as in a CPU-engine server process: SGLang's rotary module reads
    SGLANG_USE_CPU_ENGINE once, at import (else it asks for vLLM's CUDA kernel)."""
    from sglang.srt.layers.rotary_embedding import base

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setattr(base, "_is_cpu", True)


def _rope(head=64, rot=64, neox=True, max_pos=512):
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    return RotaryEmbedding(head, rot, max_pos, 10000, neox, torch.float32)


def _rope_fp64(layer, positions, x):
    """Rotate [T, H * hs] in fp64 from the layer's own cos / sin cache."""
    hs, rot = layer.head_size, layer.rotary_dim
    cs = layer.cos_sin_cache.double()[positions]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    v = x.double().reshape(x.shape[0], -1, hs).clone()
    r = v[..., :rot]
    x1, x2 = (r[..., : rot // 2], r[..., rot // 2:]) if layer.is_neox_style else (r[..., ::2], r[..., 1::2])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if layer.is_neox_style:
        v[..., :rot] = torch.cat((o1, o2), -1)
    else:
        v[..., :rot] = torch.stack((o1, o2), -1).flatten(-2)
    return v.reshape(x.shape)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rot", [64, 32])
def test_rotary_equals_sglang_native_and_fp64(kernel, neox, rot):
    layer = _rope(rot=rot, neox=neox)
    T, hq, hk = 6, 9, 3
    qkv = torch.randn(T, (hq + 2 * hk) * 64, generator=_gen(17))
    q, k, _ = qkv.split([hq * 64, hk * 64, hk * 64], dim=-1)   # strided views, as SGLang's Llama
    positions = torch.tensor([0, 1, 5, 77, 300, 511])
    gq, gk = layer_ops.rotary(layer, kernel, positions, q, k)
    nq, nk = layer.forward_native(positions, q, k)
    assert gq.shape == q.shape and gk.shape == k.shape
    assert_close_report(gq, _rope_fp64(layer, positions, q), 1e-5, 1e-5, what="rotary q vs fp64")
    assert_close_report(gk, _rope_fp64(layer, positions, k), 1e-5, 1e-5, what="rotary k vs fp64")
    assert_close_report(gq, nq, 1e-5, 1e-5, what="rotary q vs SGLang native")
    assert_close_report(gk, nk, 1e-5, 1e-5, what="rotary k vs SGLang native")
    as32 = layer_ops.rotary(layer, kernel, positions.int(), q, k)
    assert torch.equal(as32[0], gq) and torch.equal(as32[1], gk), "int32 positions"
    one_q, one_k = layer_ops.rotary(layer, kernel, positions[3:4], q[3:4], k[3:4])
    assert torch.equal(one_q, gq[3:4]) and torch.equal(one_k, gk[3:4])
    with_off = layer_ops.rotary(layer, kernel, positions - 1, q, k, offsets=torch.ones_like(positions))
    assert torch.equal(with_off[0], gq) and torch.equal(with_off[1], gk)


def test_rotary_checks_its_positions_and_takes_no_tokens(kernel):
    layer = _rope(max_pos=16)
    q, k = torch.randn(2, 64), torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="position 16 is outside the cos/sin cache"):
        layer_ops.rotary(layer, kernel, torch.tensor([3, 16]), q, k)
    none = torch.empty(0, dtype=torch.int64)
    gq, gk = kernel.rotary(none, q[:0], k[:0], layer.cos_sin_cache, 64, 64, True)
    assert gq.shape == gk.shape == (0, 64)
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        layer.forward_native(none, q[:0], k[:0])   # SGLang's own forward takes no empty batch ...
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        layer_ops.rotary(layer, kernel, none, q[:0], k[:0])   # ... and the fused layer says the same


def test_fuse_model_fuses_the_plain_layers_only(kernel):
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm
    from sglang.srt.layers.rotary_embedding.rope_variant import Llama3RotaryEmbedding

    pinned = _norm(seed=8)
    pinned._forward_method = pinned.forward_native
    model = torch.nn.ModuleDict({
        "norm": _norm(seed=9), "cast": RMSNorm(576, cast_x_before_out_mul=True),
        "gemma": GemmaRMSNorm(576), "pinned": pinned, "act": SiluAndMul(), "rope": _rope(),
        "llama3": Llama3RotaryEmbedding(64, 64, 512, 10000, True, torch.float32, 8.0, 1.0, 4.0, 8192)})
    counts = layer_ops.fuse_model(model, kernel)
    assert counts == {"RMSNorm": 1, "SiluAndMul": 1, "RotaryEmbedding": 2}
    assert model["pinned"]._forward_method == pinned.forward_native
    assert model["cast"]._forward_method is None and model["gemma"]._forward_method is None
    x = torch.randn(2, 576, generator=_gen(20))
    assert_close_report(model["norm"](x), model["norm"].forward_native(x), 1e-5, 1e-5,
                        what="fused layer through SGLang's forward()")
    pos = torch.tensor([4, 9])
    q, k = torch.randn(2, 128, generator=_gen(21)), torch.randn(2, 64, generator=_gen(22))
    for name in ("rope", "llama3"):
        got, ref = model[name](pos, q, k), model[name].forward_native(pos, q, k)
        assert_close_report(got[0], ref[0], 1e-5, 1e-5, what=f"{name} through forward()")
    assert RMSNorm is type(model["norm"])


def test_off_switch(kernel, monkeypatch):
    monkeypatch.setenv(layer_ops.ENV, "0")
    layer = _norm()
    assert layer_ops.fuse_model(torch.nn.ModuleDict({"n": layer}), kernel) == {}
    assert layer._forward_method is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fuse_draft_matches_the_plain_draft_and_keeps_autograd(kernel, dtype):
    """fuse_draft puts this package's own draft (two layers, yarn rotary so cos / sin carry a
    scale) on the norm and rotary kernels: logits and hidden match the unfused model (fp32:
    1e-5; bf16 norms round alike, rotary stays on torch there), positions past the first
    cos / sin table grow it, and a forward that needs gradients (training) runs the torch
    ops, bit-equal to the unfused model, with gradients flowing."""
    from eagle3_backend.config import DraftConfig, RopeScaling
    from eagle3_backend.model import Eagle3DraftModel

    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_hidden_layers=2, vocab_size=97,
                      draft_vocab_size=97, target_hidden_size=64, fc_norm=True,
                      rope_scaling=RopeScaling(rope_type="yarn", factor=4.0,
                                               original_max_position_embeddings=64),
                      layout=("layer_input:1", "layer_input:2", "layer_input:3"),
                      dtype=str(dtype).removeprefix("torch."))
    plain = Eagle3DraftModel.init_random(cfg, seed=3)
    fused = Eagle3DraftModel.init_random(cfg, seed=3)
    counts = layer_ops.fuse_draft(fused, kernel)
    assert counts == {"RMSNorm": 3 + 3 + 2 + 1, "rotary": 2}
    ids = torch.randint(0, 97, (2, 5), generator=_gen(30))
    hidden = torch.randn(2, 5, 192, generator=_gen(31)).to(dtype)
    pos = torch.tensor([[0, 1, 2, 3, 4], [300, 301, 302, 303, 304]])   # beyond 256: grows
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    table = lambda: fused.midlayer.self_attn.__dict__.get("_eagle3_cos_sin")  # noqa: E731
    with torch.no_grad():
        fused(ids[:1], hidden[:1], pos[:1], projected=False)
        first = table()
        want = plain(ids, hidden, pos, projected=False)
        got = fused(ids, hidden, pos, projected=False)
    for g, w, what in zip(got, want, ("logits", "hidden")):
        assert_close_report(g.float(), w.float(), tol, tol, what=f"fused draft {what} ({dtype})")
    if dtype == torch.float32:
        assert first.shape == (256, 16) and table().shape == (512, 16)
    want = plain(ids, hidden, pos, projected=False)[0]
    got = fused(ids, hidden, pos, projected=False)[0]
    assert got.requires_grad and torch.equal(got, want)
    got.float().sum().backward()
    assert fused.midlayer.hidden_norm.weight.grad is not None


@pytest.mark.parametrize("cls", layer_ops.transformers_norm_classes(), ids=lambda c: c.__name__)
def test_fuse_target_norms_match_transformers_and_fall_back(kernel, cls):
    """fuse_target puts a transformers target's Llama-family RMSNorms on the norm kernel:
    equal to the class's own forward to fp32 rounding and to fp64, each row bit for bit the
    row normed alone; a call with another dtype than the weight or needing gradients runs
    transformers' forward (bit-equal), and other norm classes are left alone."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    plain, fused, other = cls(576, eps=1e-5), cls(576, eps=1e-5), GemmaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        for m in (plain, fused):
            m.weight.copy_(torch.rand(576, generator=_gen(40)) * 2 + 0.2)
    net = torch.nn.ModuleList([fused, other])
    assert layer_ops.fuse_target(net, kernel) == 1
    assert "forward" in fused.__dict__ and "forward" not in other.__dict__
    x = torch.randn(1, 6, 576, generator=_gen(41)) * 3
    with torch.no_grad():
        got, want = fused(x), plain(x)
        assert_close_report(got, want, 1e-6, 1e-6, what=f"fused {cls.__name__}")
        ref, _ = _norm_fp64(x, plain.weight, 1e-5)
        assert_close_report(got.double(), ref, 1e-6, 1e-6, what=f"fused {cls.__name__} vs fp64")
        for i in range(6):
            assert torch.equal(fused(x[:, i:i + 1])[0, 0], got[0, i])
        xb = x.bfloat16()
        assert torch.equal(fused(xb), plain(xb))
    xg = x.clone().requires_grad_()
    assert torch.equal(fused(xg), plain(xg))


def test_draft_last_logits_are_the_last_rows(kernel):
    """A drafting extend asks the draft for its last token's logits only (last_logits): the
    LM head multiplies one row, and those logits equal the last row of a full forward's bit
    for bit (the few-row kernel computes rows alone); the hidden states are the same."""
    from eagle3_backend.config import DraftConfig
    from eagle3_backend.cpu.small_gemm import few_row_linears
    from eagle3_backend.model import Eagle3DraftModel

    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_hidden_layers=1, vocab_size=97,
                      draft_vocab_size=61, target_hidden_size=64, dtype="float32",
                      layout=("layer_input:1", "layer_input:2", "layer_input:3"))
    model = Eagle3DraftModel.init_random(cfg, seed=5)
    assert few_row_linears(model) > 0
    ids = torch.randint(0, 97, (1, 7), generator=_gen(50))
    hidden = torch.randn(1, 7, 192, generator=_gen(51))
    with torch.no_grad():
        full, h_full = model(ids, hidden, projected=False)
        last, h_last = model(ids, hidden, projected=False, last_logits=True)
    assert last.shape == (1, 1, 61) and full.shape == (1, 7, 61)
    assert torch.equal(last[0, 0], full[0, -1]) and torch.equal(h_last, h_full)
