"""Triton kernel: capture of hidden + residual into one slot of the packed fc input.

Program (t, j) writes columns [j*BLOCK_H, (j+1)*BLOCK_H) of row t of the
captured layer into its slot of the [T, K*H] buffer. The kernel uses no
shared memory beyond what Triton's layout conversions need; every config in
CONFIGS is compiled for sm_120 and sm_90 by tests/ops/test_triton_resources.py
and held to sm_120's 101,376-byte limit, 16-byte global accesses and no
register spills.

The kernel body is a plain function, wrapped on first use: a JITFunction
for CUDA tensors, an InterpretedFunction for CPU tensors (dispatch sends CPU
tensors here only under TRITON_INTERPRET=1), so the choice does not depend
on when this module was imported. The body calls Triton builtins only
(tl.full, not tl.zeros): the standard-library helpers are jit functions
fixed at triton's import to compiled or interpreted mode and break the other.

The interpreter converts float32 -> bfloat16 by truncation and mishandles
bf16 subnormals; under the constexpr EXACT_BF16 (set when interpreting) the
kernel widens bf16 by a bit shift and rounds to bf16 by integer
round-to-nearest-even instead, which is what the GPU's cvt.rn does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class CaptureConfig:
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
    CaptureConfig(256, 1),
    CaptureConfig(512, 2),
    CaptureConfig(1024, 4),
    CaptureConfig(2048, 4),
    CaptureConfig(4096, 8),
)
# Programs to keep a large GPU busy (RTX PRO 6000: 188 SMs, H100/H200: 132).
_TARGET_PROGRAMS = 4 * 188


def pick_config(num_rows: int, hidden: int) -> CaptureConfig:
    """Smallest block covering a row (capped at the largest), halved while
    the launch has too few programs to fill the GPU."""
    i = next((j for j, c in enumerate(CONFIGS) if c.block_h >= hidden), len(CONFIGS) - 1)
    while i > 0 and num_rows * triton.cdiv(hidden, CONFIGS[i].block_h) < _TARGET_PROGRAMS:
        i -= 1
    return CONFIGS[i]


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


KERNEL_BODIES = {"capture_into": _capture_into_kernel}


@functools.cache
def compiled(name: str, interpret: bool):
    """The kernel ``name`` as a JITFunction, or an InterpretedFunction for CPU."""
    body = KERNEL_BODIES[name]
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(body)
    from triton.runtime.jit import JITFunction

    return JITFunction(body)


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
    launcher above can produce, at the worst case for shared memory (bf16 in,
    float32 out, with a residual). tests/ops/test_triton_resources.py compiles
    each for sm_120 and sm_90 and holds it to the 101,376-byte limit and to no
    register spills."""
    types = {
        "buffer_ptr": "*fp32", "buffer_row_stride": "i64", "col": "i64", "hidden_ptr": "*bf16",
        "hidden_row_stride": "i64", "residual_ptr": "*bf16", "residual_row_stride": "i64", "width": "i32",
    }
    flags = {"IN_BF16": True, "OUT_BF16": False, "EXACT_BF16": False}
    for config in CONFIGS:
        consts = {"HAS_RESIDUAL": True, "BLOCK_H": config.block_h, **flags}
        yield "capture_into", _capture_into_kernel, types, consts, config
