"""Triton kernel: the draft's fc layer read straight from the K sources.

    out[n, :] = concat_k(sources[k][index[n]]) @ weight.T (+ bias)   # [N, D]

A tiled GEMM whose A operand is never materialised: the K-loop walks source
0's H columns, then source 1's, ..., loading each [BLOCK_M, BLOCK_K] tile of
A with the row gather from the source that owns those columns, and the
matching [BLOCK_K, BLOCK_N] tile of weight from columns k*H + h. The
[N, K*H] fc input (705 MB of traffic at 8,192 tokens, K=3, H=7168, bf16)
is never written or read.

Accumulation is fp32; the result is rounded once to the sources' dtype.
Summation order differs from cuBLAS, so results agree with
``F.linear(gather_concat(...))`` to rounding, not bit for bit.

Programs are ordered in groups of GROUP_M row tiles per weight column tile
(the usual L2 swizzle); one launch covers up to 8 sources. Every config in
CONFIGS is compiled for sm_120 and sm_90 by tests/ops/test_triton_resources.py
and held to sm_120's 101,376-byte shared-memory limit (the pipelined A and W
tiles dominate) and to no register spills.

Under the interpreter (CPU tensors, EXACT_BF16) bf16 and fp16 tiles are
widened to fp32 before tl.dot (the interpreter's bf16 dot is wrong) and the
fp32 -> bf16 result is rounded to nearest even by integer arithmetic, as in
gather_concat.py.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_SOURCES = 8


@dataclass(frozen=True, slots=True)
class FcConfig:
    """One GEMM tiling: rows, output columns and reduction depth per tile."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")


# Decode (few rows, weight-bandwidth bound: narrow column tiles for more
# programs), mid-size, and prefill (compute bound: large square tiles). sm_120
# has no wgmma: a tile's fp32 accumulators sit in its threads' registers, and
# 128x128x64 in 3 stages needed 248 of the 255 registers a thread may have at
# K=3 and spilled at K=8 (triton 3.8); 128x128x32 in 4 stages needs ~150-170
# and the same 48 KB of shared memory. tests/ops/test_triton_resources.py
# holds every config to no spills and sm_120's shared memory.
CONFIGS = (
    FcConfig(16, 64, 128, num_warps=4, num_stages=4),
    FcConfig(64, 64, 64, num_warps=4, num_stages=4),
    FcConfig(128, 128, 32, num_warps=8, num_stages=4),
)


def pick_config(num_rows: int) -> FcConfig:
    if num_rows <= 16:
        return CONFIGS[0]
    if num_rows <= 256:
        return CONFIGS[1]
    return CONFIGS[2]


def _fused_fc_kernel(
    out_ptr,
    out_row_stride,
    index_ptr,
    src0, src1, src2, src3, src4, src5, src6, src7,
    stride0, stride1, stride2, stride3, stride4, stride5, stride6, stride7,
    weight_ptr,
    weight_row_stride,
    bias_ptr,
    num_rows,
    hidden,
    out_features,
    NUM_SOURCES: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    IN_BF16: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    # Grouped ordering: GROUP_M row tiles share each weight column tile in L2.
    pid = tl.program_id(0)
    tiles_m = (num_rows + BLOCK_M - 1) // BLOCK_M
    tiles_n = (out_features + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_rows
    if HAS_INDEX:
        src_rows = tl.load(index_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    else:
        src_rows = rows.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < out_features
    w_cols = weight_ptr + cols.to(tl.int64) * weight_row_stride  # row `col` of weight [D, K*H]
    depth = tl.arange(0, BLOCK_K)

    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in tl.static_range(NUM_SOURCES):
        if k == 0:
            a_rows = src0 + src_rows * stride0
        elif k == 1:
            a_rows = src1 + src_rows * stride1
        elif k == 2:
            a_rows = src2 + src_rows * stride2
        elif k == 3:
            a_rows = src3 + src_rows * stride3
        elif k == 4:
            a_rows = src4 + src_rows * stride4
        elif k == 5:
            a_rows = src5 + src_rows * stride5
        elif k == 6:
            a_rows = src6 + src_rows * stride6
        else:
            a_rows = src7 + src_rows * stride7
        for h0 in range(0, hidden, BLOCK_K):
            h = h0 + depth
            h_mask = h < hidden
            a = tl.load(a_rows[:, None] + h[None, :], mask=row_mask[:, None] & h_mask[None, :], other=0.0)
            w = tl.load(w_cols[None, :] + (k * hidden + h)[:, None], mask=h_mask[:, None] & col_mask[None, :],
                        other=0.0)  # [BLOCK_K, BLOCK_N] = weight[cols, k*H + h].T
            if EXACT_BF16:  # interpreter: fp32 dot (its bf16 dot is wrong); bf16 widened by bit shift
                if IN_BF16:
                    a = (a.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
                    w = (w.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
                else:
                    a = a.to(tl.float32)
                    w = w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision="ieee")
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0)
        if EXACT_BF16 and IN_BF16:
            bias = (bias.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        acc += bias.to(tl.float32)[None, :]
    if EXACT_BF16 and IN_BF16:  # fp32 -> bf16, round to nearest even
        bits = acc.to(tl.uint32, bitcast=True)
        bits = tl.where(acc != acc, 0x7FC00000, bits + 0x7FFF + ((bits >> 16) & 1))
        result = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        result = acc.to(out_ptr.dtype.element_ty)
    out = out_ptr + rows.to(tl.int64)[:, None] * out_row_stride + cols[None, :]
    tl.store(out, result, mask=row_mask[:, None] & col_mask[None, :])


@functools.cache
def compiled(interpret: bool):
    """The kernel as a JITFunction, or an InterpretedFunction for CPU tensors."""
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_fused_fc_kernel)
    from triton.runtime.jit import JITFunction

    return JITFunction(_fused_fc_kernel)


def fused_fc(
    sources: Sequence[torch.Tensor],
    index: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: FcConfig | None = None,
) -> torch.Tensor:
    """out = concat_k(sources[k][index]) @ weight.T + bias, without the concat.

    sources: 1..8 validated tensors [T, H] (unit inner stride); index: [N]
    contiguous int32/int64 or None; weight: [D, K*H] (unit inner stride);
    bias: [D] contiguous or None; out: [N, D] (unit inner stride). All of
    one dtype.
    """
    num_rows, out_features = out.shape
    hidden = sources[0].shape[1]
    if num_rows == 0 or out_features == 0:
        return out
    if len(sources) > MAX_SOURCES:
        raise ValueError(f"fused_fc takes at most {MAX_SOURCES} sources, got {len(sources)}")
    interpret = out.device.type != "cuda"
    config = config or pick_config(num_rows)
    pointers = list(sources) + [sources[0]] * (MAX_SOURCES - len(sources))
    grid = (triton.cdiv(num_rows, config.block_m) * triton.cdiv(out_features, config.block_n),)
    compiled(interpret)[grid](
        out,
        out.stride(0),
        index if index is not None else out,
        *pointers,
        *[src.stride(0) for src in pointers],
        weight,
        weight.stride(0),
        bias if bias is not None else out,
        num_rows,
        hidden,
        out_features,
        NUM_SOURCES=len(sources),
        HAS_INDEX=index is not None,
        HAS_BIAS=bias is not None,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        IN_BF16=sources[0].dtype == torch.bfloat16,
        EXACT_BF16=interpret,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def launch_variants():
    """(name, body, arg_types, constexprs, config) of every config, at bf16 with
    a bias and an index, for 3 sources (the usual EAGLE-3 draft) and for all 8
    slots (the most registers); tests/ops/test_triton_resources.py compiles
    each for sm_120 and sm_90 and holds it to the shared-memory limit and to
    no register spills."""
    types = {"out_ptr": "*bf16", "out_row_stride": "i64", "index_ptr": "*i64", "weight_ptr": "*bf16",
             "weight_row_stride": "i64", "bias_ptr": "*bf16", "num_rows": "i32", "hidden": "i32",
             "out_features": "i32"}
    types |= {f"src{i}": "*bf16" for i in range(MAX_SOURCES)}
    types |= {f"stride{i}": "i64" for i in range(MAX_SOURCES)}
    for config, num_sources in itertools.product(CONFIGS, (3, MAX_SOURCES)):
        consts = {"NUM_SOURCES": num_sources, "HAS_INDEX": True, "HAS_BIAS": True, "BLOCK_M": config.block_m,
                  "BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "GROUP_M": config.group_m,
                  "IN_BF16": True, "EXACT_BF16": False}
        yield "fused_fc", _fused_fc_kernel, types, consts, config
