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


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16])
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


@pytest.mark.parametrize("n", [961, 962, 963])
def test_a_row_does_not_depend_on_its_batch(kernel, n):
    """Every row of an M-row call (M = 1..16: one pass over W or several, W rows taken four,
    two or one at a time, n leaving 1, 2 or 3 of them after the fours) is bit-identical to
    the same row alone: a verified token gets its decode result."""
    x = torch.randn(16, 577, generator=_gen(3))
    w = torch.randn(n, 577, generator=_gen(4))
    alone = torch.cat([small_gemm.small_linear(x[i:i + 1], w) for i in range(16)])
    for m in range(1, 17):
        got = small_gemm.small_linear(x[:m], w)
        bad = [i for i in range(m) if not torch.equal(got[i], alone[i])]
        assert not bad, f"rows {bad} of a {m}-row call differ from the same rows alone"


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
    """The platform's linear method uses the kernel for 1..16 fp32 rows (a decode step's one
    row included): bit-identical to calling it directly; more rows keep the oneDNN path."""
    layer = torch.nn.Linear(64, 96, bias=False)
    x = torch.randn(4, 64, generator=_gen(9))
    for rows in (1, 4):
        assert torch.equal(packed_linear.packed_linear(layer, x[:rows], None),
                           small_gemm.small_linear(x[:rows], layer.weight))
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
    """few_row_linears: 1..16 rows without autograd go to the kernel (bit-identical to it);
    17+ rows and anything that needs gradients keep F.linear exactly."""
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
        one = small_gemm.small_linear(F.silu(small_gemm.small_linear(x[:1], model[0].weight, model[0].bias)),
                                      model[2].weight, model[2].bias)
        assert torch.equal(model(x[:1]), one)
        xr = torch.randn(17, 48, generator=_gen(17))
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


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 16])
@pytest.mark.parametrize("n,k", [(33, 577), (1, 7), (960, 576)])
def test_a_bf16_weight_gives_the_fp32_kernels_result_bit_for_bit(kernel, rows, n, k):
    """A bf16 weight is widened exactly and multiplied in the fp32 kernel's order."""
    x = torch.randn(rows, k, generator=_gen(20 + rows))
    wb = (torch.randn(n, k, generator=_gen(30 + n)) / k ** 0.5).bfloat16()
    b = torch.randn(n, generator=_gen(8))
    assert torch.equal(small_gemm.small_linear(x, wb, b), small_gemm.small_linear(x, wb.float(), b))
    assert torch.equal(small_gemm.small_linear(x, wb), small_gemm.small_linear(x, wb.float()))
    with pytest.raises(RuntimeError, match="weight BFloat16"):
        kernel.small_linear_bf16w(x, wb.float(), None)
    with pytest.raises(RuntimeError, match="x must be float32"):
        kernel.small_linear_bf16w(x.bfloat16(), wb, None)


def test_kernel_linear_streams_an_exact_bf16_copy_and_follows_the_weight(kernel, monkeypatch):
    """A weight bf16 holds exactly is multiplied from its bf16 copy for 1..16 rows (the fp32
    kernel's result bit for bit); any other weight takes the fp32 kernel; an in-place change
    or a replacement is checked again."""
    layer = torch.nn.Linear(576, 200, bias=True)
    with torch.no_grad():
        layer.weight.copy_(layer.weight.bfloat16().float())
    assert small_gemm.bf16_exact(layer.weight)
    x = torch.randn(4, 576, generator=_gen(15))
    for rows in (1, 4):
        assert torch.equal(small_gemm.kernel_linear(layer, x[:rows], layer.bias),
                           small_gemm.small_linear(x[:rows], layer.weight, layer.bias))
    copy = layer.__dict__[small_gemm.BF16_STATE][2]
    assert copy.dtype == torch.bfloat16 and torch.equal(copy.float(), layer.weight)
    assert torch.equal(packed_linear.packed_linear(layer, x[:1], layer.bias),
                       small_gemm.small_linear(x[:1], layer.weight, layer.bias))
    with torch.no_grad():
        layer.weight[3, 5] += 1e-3                      # no longer bf16
    assert not small_gemm.bf16_exact(layer.weight)
    assert layer.__dict__[small_gemm.BF16_STATE][2] is not None             # not remade yet
    for rows in (1, 4):
        assert torch.equal(small_gemm.kernel_linear(layer, x[:rows], layer.bias),
                           small_gemm.small_linear(x[:rows], layer.weight, layer.bias))
    assert layer.__dict__[small_gemm.BF16_STATE][2] is None                 # fp32 from now on
    layer.weight = torch.nn.Parameter(torch.full((200, 576), 0.5))   # exact again
    assert torch.equal(small_gemm.kernel_linear(layer, x[:1], None),
                       small_gemm.small_linear(x[:1], layer.weight))
    assert layer.__dict__[small_gemm.BF16_STATE][0] is layer.weight
    monkeypatch.setenv(small_gemm.ENV_BF16, "0")
    layer.weight = torch.nn.Parameter(torch.full((200, 576), 0.25))  # exact, copy not made
    assert torch.equal(small_gemm.kernel_linear(layer, x[:1], None),
                       small_gemm.small_linear(x[:1], layer.weight))
    assert layer.__dict__[small_gemm.BF16_STATE][0] is not layer.weight  # no bf16 copy made
    assert small_gemm.bf16_exact(torch.zeros(3, 4)) and not small_gemm.bf16_exact(torch.zeros(3, 4)[:, ::2])


def test_the_offline_verifiers_fp32_draft_streams_its_bf16_checkpoint(kernel):
    """eagle3 eval's draft at fp32 from a bf16 checkpoint (the shipped one): its linear
    layers multiply one row from their exact bf16 copies, the fp32 kernel's result."""
    from pathlib import Path

    from eagle3_backend.verify.engine import load_draft_model

    shipped = Path(__file__).resolve().parents[2] / "drafts" / "smollm2-135m-eagle3"
    draft = load_draft_model(shipped, None, dtype=torch.float32)
    fc = draft.fc
    assert fc.weight.dtype == torch.float32 and small_gemm.bf16_exact(fc.weight)
    x = torch.randn(1, fc.in_features, generator=_gen(16))
    with torch.no_grad():
        assert torch.equal(fc(x), small_gemm.small_linear(x, fc.weight, fc.bias))
    assert fc.__dict__[small_gemm.BF16_STATE][2].dtype == torch.bfloat16
