"""The few-row linear kernel (eagle3_backend/cpu/kernels/small_gemm.cpp): equals an fp64
reference, rows independent of each other bit for bit, clear errors, and the fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpu_testutil import assert_close_report
from eagle3_backend.cpu import packed_linear, small_gemm


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("n,k", [(96, 64), (33, 577), (1, 7), (3072, 576)])
def test_equals_fp64_reference(kernel, rows, n, k):
    x = torch.randn(rows, k, generator=_gen(rows))
    w = torch.randn(n, k, generator=_gen(1000 + n)) / k ** 0.5
    b = torch.randn(n, generator=_gen(7))
    ref = F.linear(x.double(), w.double(), b.double())
    assert_close_report(small_gemm.small_linear(x, w, b), ref, 2e-5, 1e-5,
                        what=f"small_linear {rows}x{k} . {n}x{k}")
    assert_close_report(small_gemm.small_linear(x, w), F.linear(x.double(), w.double()), 2e-5, 1e-5,
                        what="small_linear without bias")


def test_a_row_does_not_depend_on_its_batch(kernel):
    """Row i of a 4-row call is bit-identical to the same row alone (and in a 16-row call)."""
    x = torch.randn(16, 576, generator=_gen(3))
    w = torch.randn(960, 576, generator=_gen(4))
    four = small_gemm.small_linear(x[:4], w)
    sixteen = small_gemm.small_linear(x, w)
    for i in range(4):
        one = small_gemm.small_linear(x[i:i + 1], w)
        assert torch.equal(four[i:i + 1], one), f"row {i}: 4-row call differs from 1-row call"
        assert torch.equal(sixteen[i:i + 1], one), f"row {i}: 16-row call differs from 1-row call"


def test_leading_dims_and_non_contiguous_inputs(kernel):
    x = torch.randn(2, 3, 80, generator=_gen(5))
    w = torch.randn(64, 40, generator=_gen(6))
    xs = x[..., ::2]                                   # [2, 3, 40], not contiguous
    got = small_gemm.small_linear(xs, w)
    assert got.shape == (2, 3, 64)
    assert_close_report(got, F.linear(xs.double(), w.double()), 2e-5, 1e-5, what="strided x")


def test_errors_name_the_problem(kernel):
    w = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.small_linear(torch.randn(2, 16, dtype=torch.float64), w, None)
    with pytest.raises(RuntimeError, match="columns"):
        kernel.small_linear(torch.randn(2, 15), w, None)
    with pytest.raises(RuntimeError, match="rows"):
        kernel.small_linear(torch.randn(17, 16), w, None)
    with pytest.raises(RuntimeError, match="bias"):
        kernel.small_linear(torch.randn(2, 16), w, torch.randn(7))


def test_supports_only_what_the_kernel_takes():
    w = torch.randn(8, 16)
    assert small_gemm.supports(torch.randn(16, 16), w, None)
    assert not small_gemm.supports(torch.randn(17, 16), w, None)            # too many rows
    assert not small_gemm.supports(torch.randn(2, 16).bfloat16(), w, None)  # dtype
    assert not small_gemm.supports(torch.randn(0, 16), w, None)             # no rows
    assert not small_gemm.supports(torch.randn(2, 16), w, torch.randn(8).double())


def test_packed_linear_routes_few_fp32_rows_to_the_kernel(kernel):
    """The platform's linear method uses the kernel for 2..16 fp32 rows: bit-identical to
    calling it directly; one row stays on F.linear, more rows keep the oneDNN path."""
    layer = torch.nn.Linear(64, 96, bias=False)
    x = torch.randn(4, 64, generator=_gen(9))
    assert torch.equal(packed_linear.packed_linear(layer, x, None),
                       small_gemm.small_linear(x, layer.weight))
    assert torch.equal(packed_linear.packed_linear(layer, x[:1], None), F.linear(x[:1], layer.weight))
    big = torch.randn(40, 64, generator=_gen(10))
    assert_close_report(packed_linear.packed_linear(layer, big, None),
                        F.linear(big.double(), layer.weight.double()), 2e-5, 1e-5,
                        what="40 rows through oneDNN")


def test_disabled_by_env_means_fallback(monkeypatch):
    monkeypatch.setenv(small_gemm.ENV, "0")
    assert small_gemm.load() is None
    layer = torch.nn.Linear(64, 96, bias=False)
    x = torch.randn(4, 64, generator=_gen(11))
    with pytest.raises(RuntimeError, match=small_gemm.ENV):
        small_gemm.small_linear(x, layer.weight)
    assert_close_report(packed_linear.packed_linear(layer, x, None),
                        F.linear(x.double(), layer.weight.double()), 2e-5, 1e-5,
                        what="oneDNN fallback")


def test_few_row_linears_routes_inference_only(kernel):
    """few_row_linears: 2..16 rows without autograd go to the kernel (bit-identical to it);
    one row, 17+ rows and anything that needs gradients keep F.linear exactly."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 80), torch.nn.SiLU(), torch.nn.Linear(80, 24))
    ref = [m.forward for m in (model[0], model[2])]
    assert small_gemm.few_row_linears(model) == 2
    x = torch.randn(4, 48, generator=_gen(12))
    with torch.no_grad():
        got = model(x)
        want = small_gemm.small_linear(F.silu(small_gemm.small_linear(x, model[0].weight, model[0].bias)),
                                       model[2].weight, model[2].bias)
        assert torch.equal(got, want)
        for rows in (1, 17):
            xr = torch.randn(rows, 48, generator=_gen(rows))
            assert torch.equal(model(xr), ref[1](F.silu(ref[0](xr))))
    y = model(x)                               # grad enabled, weights require grad: F.linear
    assert torch.equal(y, ref[1](F.silu(ref[0](x))))
    y.sum().backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0


def test_a_finished_build_is_imported_directly(kernel, tmp_path):
    """With the .so in place it is imported directly (no build step); a broken or missing
    .so is reported as unusable (load() then builds)."""
    mod = small_gemm._import_built(small_gemm.build_dir())
    assert mod is not None and mod.max_rows == small_gemm.MAX_ROWS
    x, w = torch.randn(3, 40, generator=_gen(13)), torch.randn(24, 40, generator=_gen(14))
    assert torch.equal(mod.small_linear(x, w, None), kernel.small_linear(x, w, None))
    (tmp_path / f"{small_gemm.MODULE_NAME}.so").write_bytes(b"not a shared object")
    assert small_gemm._import_built(tmp_path) is None
    assert small_gemm._import_built(tmp_path / "missing") is None
