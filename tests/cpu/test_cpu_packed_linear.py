"""Packed oneDNN linear: equals F.linear, follows weight changes, falls back when it must."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpu_testutil import assert_close_report
from eagle3_backend.cpu import packed_linear, small_gemm

pytestmark = pytest.mark.skipif(not packed_linear.supports(torch.float32),
                                reason="this torch build has no oneDNN linear (the platform then keeps F.linear)")


class _Layer(torch.nn.Module):
    def __init__(self, n: int, k: int, seed: int, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(n, k, generator=g).to(dtype), requires_grad=False)


@pytest.mark.parametrize("rows", [1, 4, 7, 33])
def test_packed_equals_linear_fp32(rows):
    layer = _Layer(96, 64, seed=rows)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(100 + rows))
    bias = torch.randn(96, generator=torch.Generator().manual_seed(7))
    assert_close_report(packed_linear.packed_linear(layer, x, bias), F.linear(x, layer.weight, bias),
                        1e-5, 1e-5, what=f"packed linear, {rows} rows")


def test_packed_keeps_leading_dims_and_bf16():
    if not packed_linear.supports(torch.bfloat16):
        pytest.skip("no oneDNN bf16 on this CPU")
    layer = _Layer(48, 32, seed=1, dtype=torch.bfloat16)
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = packed_linear.packed_linear(layer, x, None)
    assert got.shape == (2, 3, 48) and got.dtype == torch.bfloat16
    assert_close_report(got, x.double() @ layer.weight.double().T, 0.1, 0.02, what="packed bf16")


def test_repacks_after_in_place_update_and_replacement(monkeypatch):
    monkeypatch.setenv(small_gemm.ENV, "0")                  # 4 rows would go to the few-row kernel
    layer = _Layer(16, 8, seed=3)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    packed_linear.packed_linear(layer, x, None)
    with torch.no_grad():
        layer.weight.mul_(-2.0)                              # in place: version counter moves
    assert_close_report(packed_linear.packed_linear(layer, x, None), F.linear(x, layer.weight),
                        1e-5, 1e-5, what="after in-place update")
    layer.weight = torch.nn.Parameter(torch.ones(16, 8), requires_grad=False)  # new tensor
    assert_close_report(packed_linear.packed_linear(layer, x, None), F.linear(x, layer.weight),
                        1e-5, 1e-5, what="after replacement")


@pytest.mark.sglang
@pytest.mark.parametrize("which", [2, 3])  # the linear and the LM-head method
def test_a_load_through_data_repacks_after_sglangs_post_load_step(monkeypatch, which):
    """SGLang's loaders copy into ``param.data`` (the version counter does not move) and then
    call each quant method's ``process_weights_after_loading``: the packed copy follows."""
    monkeypatch.setenv(small_gemm.ENV, "0")
    method = packed_linear._method_classes()[which]()
    layer = _Layer(16, 8, seed=6)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(8))
    packed_linear.packed_linear(layer, x, None)
    version = layer.weight._version
    layer.weight.data.copy_(torch.full((16, 8), 0.5))
    assert layer.weight._version == version                  # invisible to the cache's key
    method.process_weights_after_loading(layer)
    assert_close_report(method.apply(layer, x), F.linear(x, layer.weight), 1e-5, 1e-5,
                        what="after a load through .data")


def test_falls_back_on_dtype_mismatch_and_empty_input():
    layer = _Layer(16, 8, seed=5)
    x = torch.randn(3, 8, dtype=torch.float64)
    assert packed_linear.packed_linear(layer, x.float(), None).dtype == torch.float32
    with pytest.raises(RuntimeError):
        packed_linear.packed_linear(layer, x, None)          # F.linear refuses mixed dtypes, as before
    assert packed_linear.packed_linear(layer, torch.empty(0, 8), None).shape == (0, 16)
