"""capture_into: build the draft's fc input at capture time, one layer at a time.

    buffer[:, k*H:(k+1)*H] = (hidden + residual).to(buffer.dtype)   # buffer: [T, K*H]

Each captured layer input goes straight into its layout slot of one preallocated
buffer, so the fc input is never concatenated; after verify SGLang selects rows of
that one packed tensor (docs/kernels.md, "The accepted-row gather in SGLang 0.5.23").

Backends (see _dispatch.py): "cuda" (csrc/, 16-byte vector loads and stores),
"triton" (ops/triton/capture_into.py), "torch" (ops/reference.py). All
three produce identical bits, casts included (round to nearest even).
"""

from __future__ import annotations

import torch

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _dispatch, reference


def _layout_problem(tensors: list[torch.Tensor]) -> str | None:
    """Why the kernels cannot take these tensors as they are (torch can)."""
    for t in tensors:
        if t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
            return f"a tensor has inner stride {t.stride(1)} (kernels need 1)"
    return None


def capture_into(
    buffer: torch.Tensor,
    slot: int,
    hidden: torch.Tensor,
    residual: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Write one captured layer input into its slot of the packed fc-input buffer.

    Args:
        buffer: [T, K*H] preallocated packed buffer (inner stride 1).
        slot: k in [0, K): the position of this capture in the layout.
        hidden: [T, H] the layer's hidden-state input ...
        residual: [T, H] ... and the residual stream (same dtype), or None
            when ``hidden`` already is the residual stream.
        backend: "cuda", "triton" or "torch"; None = $EAGLE3_KERNEL_BACKEND
            or automatic (see eagle3_backend.ops.describe_backends()).

    Returns:
        buffer, with buffer[:, slot*H:(slot+1)*H] = (hidden + residual)
        rounded to hidden's dtype (exactly the model's own sum), then cast
        to buffer's dtype.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise KernelError(f"capture_into: hidden must be a 2-D tensor [T, H], got {getattr(hidden, 'shape', hidden)}")
    if not isinstance(buffer, torch.Tensor) or buffer.dim() != 2:
        raise KernelError(f"capture_into: buffer must be a 2-D tensor [T, K*H], got {getattr(buffer, 'shape', buffer)}")
    rows, width = hidden.shape
    if width == 0 or buffer.shape[1] % width != 0:
        raise KernelError(
            f"capture_into: buffer width {buffer.shape[1]} is not a multiple of hidden's width {width}; "
            f"allocate the buffer as [T, K*{width}]."
        )
    slots = buffer.shape[1] // width
    if not 0 <= slot < slots:
        raise KernelError(f"capture_into: slot must be in [0, {slots}), got {slot}")
    if buffer.shape[0] != rows:
        raise KernelError(
            f"capture_into: buffer has {buffer.shape[0]} rows but hidden has {rows}; pass buffer[:{rows}]."
        )
    if residual is not None:
        if residual.shape != hidden.shape:
            raise KernelError(
                f"capture_into: residual has shape {tuple(residual.shape)} but hidden has {tuple(hidden.shape)}"
            )
        if residual.dtype != hidden.dtype:
            raise KernelError(f"capture_into: residual is {residual.dtype} but hidden is {hidden.dtype}")
    for name, t in (("hidden", hidden), ("residual", residual)):
        if t is not None and t.device != buffer.device:
            raise KernelError(f"capture_into: {name} is on {t.device} but buffer is on {buffer.device}")

    tensors = [buffer, hidden] + ([residual] if residual is not None else [])
    choice = _dispatch.resolve(
        "capture_into",
        buffer.device,
        (hidden.dtype, buffer.dtype),
        backend,
        strict_layout=_layout_problem(tensors),
    )
    if choice.backend == "cuda":
        torch.ops.eagle3.capture_into(buffer, slot, hidden, residual)
    elif choice.backend == "triton":
        from eagle3_backend.ops.triton import capture_into as triton_capture

        triton_capture.capture_into(buffer, slot, hidden, residual)
    else:
        reference.capture_into_ref(buffer, slot, hidden, residual)
    return buffer
