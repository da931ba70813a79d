"""Triton kernels: fused row gather + concat, and capture of hidden + residual.

One launch covers up to 8 sources (more are split into launches that write
disjoint column ranges of ``out``). Program (n, j) copies columns
[j*BLOCK_H, (j+1)*BLOCK_H) of output row n from every source. The kernels use
no shared memory beyond what Triton's layout conversions need; every config
in CONFIGS is compiled for sm_120 and sm_90 by tests/ops/test_triton_resources.py
and held to sm_120's 101,376-byte limit, 16-byte global accesses and no
register spills.

The kernel bodies are plain functions, wrapped on first use: a JITFunction
for CUDA tensors, an InterpretedFunction for CPU tensors (dispatch sends CPU
tensors here only under TRITON_INTERPRET=1), so the choice does not depend
on when this module was imported. Kernel bodies call Triton builtins only
(tl.full, not tl.zeros): the standard-library helpers are jit functions
fixed at triton's import to compiled or interpreted mode and break the other.

The interpreter converts float32 -> bfloat16 by truncation and mishandles
bf16 subnormals; under the constexpr EXACT_BF16 (set when interpreting) the
kernels widen bf16 by a bit shift and round to bf16 by integer
round-to-nearest-even instead, which is what the GPU's cvt.rn does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_SOURCES = 8


@dataclass(frozen=True, slots=True)
class GatherConfig:
    """Columns per program, warps per program, pipeline stages (no loop: 1)."""

    block_h: int
    num_warps: int
    num_stages: int = 1

    def __post_init__(self) -> None:
        if self.block_h < 16 or self.block_h & (self.block_h - 1):
            raise ValueError(f"block_h must be a power of two >= 16, got {self.block_h}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


# Every config pick_config can return (the sm_120 shared-memory test walks these).
CONFIGS = (
    GatherConfig(256, 1),
    GatherConfig(512, 2),
    GatherConfig(1024, 4),
    GatherConfig(2048, 4),
    GatherConfig(4096, 8),
)
# Programs to keep a large GPU busy (RTX PRO 6000: 188 SMs, H100/H200: 132).
_TARGET_PROGRAMS = 4 * 188


def pick_config(num_rows: int, hidden: int) -> GatherConfig:
    """Smallest block covering a row (capped at the largest), halved while
    the launch has too few programs to fill the GPU."""
    i = next((j for j, c in enumerate(CONFIGS) if c.block_h >= hidden), len(CONFIGS) - 1)
    while i > 0 and num_rows * triton.cdiv(hidden, CONFIGS[i].block_h) < _TARGET_PROGRAMS:
        i -= 1
    return CONFIGS[i]


def _gather_concat_kernel(
    out_ptr,
    out_row_stride,
    index_ptr,
    src0, src1, src2, src3, src4, src5, src6, src7,
    stride0, stride1, stride2, stride3, stride4, stride5, stride6, stride7,
    hidden,
    NUM_SOURCES: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    IN_BF16: tl.constexpr,
    OUT_BF16: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < hidden
    if HAS_INDEX:
        src_row = tl.load(index_ptr + row).to(tl.int64)
    else:
        src_row = row
    out_row = out_ptr + row * out_row_stride
    for k in tl.static_range(NUM_SOURCES):
        if k == 0:
            src = src0 + src_row * stride0
        elif k == 1:
            src = src1 + src_row * stride1
        elif k == 2:
            src = src2 + src_row * stride2
        elif k == 3:
            src = src3 + src_row * stride3
        elif k == 4:
            src = src4 + src_row * stride4
        elif k == 5:
            src = src5 + src_row * stride5
        elif k == 6:
            src = src6 + src_row * stride6
        else:
            src = src7 + src_row * stride7
        values = tl.load(src + cols, mask=mask)
        if EXACT_BF16 and IN_BF16 and not OUT_BF16:  # bf16 -> fp32 by bit shift
            values = (values.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        if EXACT_BF16 and OUT_BF16 and not IN_BF16:  # fp32 -> bf16, round to nearest even
            wide = values.to(tl.float32)
            bits = wide.to(tl.uint32, bitcast=True)
            bits = tl.where(wide != wide, 0x7FC00000, bits + 0x7FFF + ((bits >> 16) & 1))
            values = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        tl.store(out_row + k * hidden + cols, values.to(out_ptr.dtype.element_ty), mask=mask)


def _capture_into_kernel(
    buffer_ptr,
    buffer_row_stride,
    col,
    hidden_ptr,
    hidden_row_stride,
    residual_ptr,
    residual_row_stride,
    width,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    IN_BF16: tl.constexpr,
    OUT_BF16: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < width
    values = tl.load(hidden_ptr + row * hidden_row_stride + cols, mask=mask)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask)
        if EXACT_BF16 and IN_BF16:  # widen by bit shift, add, round to nearest even
            wide = (values.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            wide += (residual.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            bits = wide.to(tl.uint32, bitcast=True)
            bits = tl.where(wide != wide, 0x7FC00000, bits + 0x7FFF + ((bits >> 16) & 1))
            values = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:  # rounded to the sources' dtype, like torch's hidden + residual
            values = (values.to(tl.float32) + residual.to(tl.float32)).to(hidden_ptr.dtype.element_ty)
    if EXACT_BF16 and IN_BF16 and not OUT_BF16:
        values = (values.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    if EXACT_BF16 and OUT_BF16 and not IN_BF16:
        wide = values.to(tl.float32)
        bits = wide.to(tl.uint32, bitcast=True)
        bits = tl.where(wide != wide, 0x7FC00000, bits + 0x7FFF + ((bits >> 16) & 1))
        values = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    tl.store(
        buffer_ptr + row * buffer_row_stride + col + cols,
        values.to(buffer_ptr.dtype.element_ty),
        mask=mask,
    )


KERNEL_BODIES = {"gather_concat": _gather_concat_kernel, "capture_into": _capture_into_kernel}


@functools.cache
def compiled(name: str, interpret: bool):
    """The kernel ``name`` as a JITFunction, or an InterpretedFunction for CPU."""
    body = KERNEL_BODIES[name]
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(body)
    from triton.runtime.jit import JITFunction

    return JITFunction(body)


def gather_concat(
    sources: Sequence[torch.Tensor],
    index: torch.Tensor | None,
    out: torch.Tensor,
) -> torch.Tensor:
    """out[:, k*H:(k+1)*H] = sources[k][index] (cast to out.dtype).

    sources: K validated tensors [T, H] with unit inner stride; index: [N]
    contiguous int32/int64 or None; out: [N, K*H] with unit inner stride.
    """
    num_rows = out.shape[0]
    hidden = sources[0].shape[1]
    if num_rows == 0 or hidden == 0:
        return out
    interpret = out.device.type != "cuda"
    kernel = compiled("gather_concat", interpret)
    config = pick_config(num_rows, hidden)
    grid = (num_rows, triton.cdiv(hidden, config.block_h))
    for k0 in range(0, len(sources), MAX_SOURCES):
        chunk = list(sources[k0 : k0 + MAX_SOURCES])
        pointers = chunk + [chunk[0]] * (MAX_SOURCES - len(chunk))
        strides = [src.stride(0) for src in pointers]
        kernel[grid](
            out[:, k0 * hidden :],
            out.stride(0),
            index if index is not None else out,
            *pointers,
            *strides,
            hidden,
            NUM_SOURCES=len(chunk),
            HAS_INDEX=index is not None,
            BLOCK_H=config.block_h,
            IN_BF16=sources[0].dtype == torch.bfloat16,
            OUT_BF16=out.dtype == torch.bfloat16,
            EXACT_BF16=interpret,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return out


def capture_into(
    buffer: torch.Tensor,
    slot: int,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """buffer[:, slot*H:(slot+1)*H] = (hidden + residual) (see reference.py)."""
    rows, width = hidden.shape
    if rows == 0 or width == 0:
        return buffer
    interpret = buffer.device.type != "cuda"
    kernel = compiled("capture_into", interpret)
    config = pick_config(rows, width)
    grid = (rows, triton.cdiv(width, config.block_h))
    kernel[grid](
        buffer,
        buffer.stride(0),
        slot * width,
        hidden,
        hidden.stride(0),
        residual if residual is not None else hidden,
        residual.stride(0) if residual is not None else 0,
        width,
        HAS_RESIDUAL=residual is not None,
        BLOCK_H=config.block_h,
        IN_BF16=hidden.dtype == torch.bfloat16,
        OUT_BF16=buffer.dtype == torch.bfloat16,
        EXACT_BF16=interpret,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return buffer


def launch_variants():
    """(name, body, arg_types, constexprs, config) of every compiled variant the
    launchers above can produce, at the worst case for shared memory (bf16 in,
    float32 out, all 8 source slots). tests/ops/test_triton_resources.py compiles
    each for sm_120 and sm_90 and holds it to the 101,376-byte limit and to no
    register spills."""
    gather_types = {"out_ptr": "*fp32", "out_row_stride": "i64", "index_ptr": "*i64", "hidden": "i32"}
    gather_types |= {f"src{i}": "*bf16" for i in range(MAX_SOURCES)}
    gather_types |= {f"stride{i}": "i64" for i in range(MAX_SOURCES)}
    capture_types = {
        "buffer_ptr": "*fp32", "buffer_row_stride": "i64", "col": "i64", "hidden_ptr": "*bf16",
        "hidden_row_stride": "i64", "residual_ptr": "*bf16", "residual_row_stride": "i64", "width": "i32",
    }
    flags = {"IN_BF16": True, "OUT_BF16": False, "EXACT_BF16": False}
    for config in CONFIGS:
        gather_consts = {"NUM_SOURCES": MAX_SOURCES, "HAS_INDEX": True, "BLOCK_H": config.block_h, **flags}
        yield "gather_concat", _gather_concat_kernel, gather_types, gather_consts, config
        capture_consts = {"HAS_RESIDUAL": True, "BLOCK_H": config.block_h, **flags}
        yield "capture_into", _capture_into_kernel, capture_types, capture_consts, config
