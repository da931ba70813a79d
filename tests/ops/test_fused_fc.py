"""fused_fc: the concat-free fc GEMM against an fp64 statement of the op.

The fused kernel sums in a different order from the matmul of the torch
path, so results are held to an error bound instead of bits: one rounding of
the output dtype plus fp32 accumulation over K*H terms. A layout mistake (a
swapped source, a wrong weight column block) is far outside that bound, and
a test checks the bound catches one.
"""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.errors import KernelError
from eagle3_backend.ops.fused_fc import fused_fc
from eagle3_backend.ops.triton import fused_fc as triton_fc

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _case(k: int, t: int, h: int, d: int, dtype: torch.dtype, device: str = "cpu"):
    sources = [torch.randn(t, h).to(dtype).to(device) for _ in range(k)]
    weight = (torch.randn(d, k * h) / (k * h) ** 0.5).to(dtype).to(device)  # [D, K*H]
    bias = torch.randn(d).to(dtype).to(device)
    return sources, weight, bias


def _reference(sources, weight, index, bias):
    """fp64 result and the per-element error bound of an fp32-accumulated
    GEMM rounded once to the output dtype."""
    rows = [s.cpu().double() if index is None else s.cpu().double()[index.cpu().long()] for s in sources]
    x = torch.cat(rows, dim=1)  # [N, K*H]
    w = weight.cpu().double()
    ref = x @ w.t() + (bias.cpu().double() if bias is not None else 0.0)
    magnitude = x.abs() @ w.abs().t() + (bias.cpu().double().abs() if bias is not None else 0.0)
    eps_out = torch.finfo(weight.dtype).eps
    bound = eps_out * ref.abs() + x.shape[1] * 2.0**-24 * magnitude + 1e-30
    return ref, bound


def _assert_within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    err = (got.cpu().double() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{what}: error {err.max().item():.3g} is {worst:.2f}x the rounding bound"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k,hidden", [(1, 200), (3, 200), (3, 576), (4, 72)])
@pytest.mark.parametrize("with_index,with_bias", [(True, True), (False, False)])
def test_triton_within_rounding_of_fp64(dtype, k, hidden, with_index, with_bias):
    sources, weight, bias = _case(k, 11, hidden, 150, dtype)
    index = torch.tensor([10, 3, 3, 0, 7, 3]) if with_index else None  # repeats
    bias = bias if with_bias else None
    got = fused_fc(sources, weight, index, bias, backend="triton")
    assert got.shape == (6 if with_index else 11, 150) and got.dtype == dtype
    ref, bound = _reference(sources, weight, index, bias)
    _assert_within(got, ref, bound, f"triton {dtype} K={k} H={hidden}")
    _assert_within(fused_fc(sources, weight, index, bias, backend="torch"), ref, bound, "torch path")


@pytest.mark.parametrize("config", triton_fc.CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}x{c.block_k}")
def test_every_config_covers_ragged_tiles(config):
    """Row and column counts that leave partial tiles, more row tiles than a
    swizzle group, and every source: each config computes the same op."""
    rows = 2 * config.block_m * config.group_m + 3 if config.block_m <= 16 else config.block_m + 5
    sources, weight, bias = _case(3, rows + 4, 40, config.block_n + 9, torch.float32)
    index = torch.randint(0, rows + 4, (rows,))
    out = torch.empty(rows, weight.shape[0])
    triton_fc.fused_fc(sources, index, weight, bias, out, config=config)
    ref, bound = _reference(sources, weight, index, bias)
    _assert_within(out, ref, bound, f"config {config}")


def test_bound_catches_a_layout_mistake():
    sources, weight, bias = _case(3, 8, 64, 32, torch.bfloat16)
    ref, bound = _reference(sources, weight, None, bias)
    swapped = fused_fc([sources[1], sources[0], sources[2]], weight, None, bias, backend="triton")
    err = ((swapped.double() - ref).abs() / bound).max().item()
    assert err > 10, f"swapping two sources stayed within {err:.2f}x the bound: the test could not fail"


def test_stacked_sources_and_out():
    sources, weight, bias = _case(3, 9, 48, 20, torch.float32)
    out = torch.full((9, 20), float("nan"))
    result = fused_fc(torch.stack(sources), weight, bias=bias, out=out, backend="triton")
    assert result is out
    ref, bound = _reference(sources, weight, None, bias)
    _assert_within(out, ref, bound, "stacked")


def test_empty_index():
    sources, weight, _ = _case(2, 5, 32, 16, torch.float32)
    out = fused_fc(sources, weight, torch.empty(0, dtype=torch.long), backend="triton")
    assert out.shape == (0, 16)


def test_errors_name_the_problem(monkeypatch):
    sources, weight, bias = _case(3, 5, 32, 16, torch.float32)
    with pytest.raises(KernelError, match=r"weight is \[16, 96\].*\[D, 64\]"):
        fused_fc(sources[:2], weight)
    with pytest.raises(KernelError, match="weight is torch.bfloat16 but the sources are torch.float32"):
        fused_fc(sources, weight.bfloat16())
    with pytest.raises(KernelError, match=r"bias must be \[D\] = \[16\]"):
        fused_fc(sources, weight, bias=bias[:8])
    with pytest.raises(KernelError, match=r"fused_fc: index holds 5, outside \[0, 5\)"):
        fused_fc(sources, weight, torch.tensor([5]))
    with pytest.raises(KernelError, match=r"out must be \[5, 16\]"):
        fused_fc(sources, weight, out=torch.empty(5, 17))
    with pytest.raises(KernelError, match="backend must be one of"):
        fused_fc(sources, weight, backend="cuda")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(KernelError, match="TRITON_INTERPRET is not set.*backend='torch'"):
        fused_fc(sources, weight, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64, 1024])
def test_gpu_kimi_shape_matches_torch_path(rows):
    sources, weight, bias = _case(3, rows + 7, 7168, 1024, torch.bfloat16, "cuda")
    index = torch.randperm(rows + 7, device="cuda")[:rows]
    got = fused_fc(sources, weight, index, None, backend="triton")
    ref, bound = _reference(sources, weight, index, None)
    _assert_within(got, ref, bound, f"triton N={rows} on {torch.cuda.get_device_name()}")
