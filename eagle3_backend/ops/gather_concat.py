"""gather_concat: build the draft's fc input from K target hidden states.

    out[n, k*H:(k+1)*H] = sources[k][index[n]]          # out: [N, K*H]

in one launch, instead of K index_selects and a torch.cat (two round trips
through memory). ``capture_into`` is the capture-time variant: it writes
``hidden + residual`` of one captured layer straight into its slot of a
preallocated [T, K*H] buffer, so no concat is ever needed.

Backends (see _dispatch.py): "cuda" (csrc/, 16-byte vector loads and stores),
"triton" (ops/triton/gather_concat.py), "torch" (ops/reference.py). All
three produce identical bits, casts included (round to nearest even).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _dispatch, reference

SourcesLike = Sequence[torch.Tensor] | torch.Tensor


def _as_source_list(sources: SourcesLike, op: str = "gather_concat") -> list[torch.Tensor]:
    """K tensors [T, H] from a sequence of them or one [K, T, H] tensor."""
    if isinstance(sources, torch.Tensor):
        if sources.dim() != 3:
            raise KernelError(
                f"{op}: a single sources tensor must be [K, T, H], got shape "
                f"{tuple(sources.shape)}. Pass a list of [T, H] tensors, or stack them."
            )
        return list(sources.unbind(0))
    sources = list(sources)
    if not sources:
        raise KernelError(f"{op}: sources is empty; expected K >= 1 tensors [T, H]")
    for k, src in enumerate(sources):
        if not isinstance(src, torch.Tensor) or src.dim() != 2:
            what = tuple(src.shape) if isinstance(src, torch.Tensor) else type(src).__name__
            raise KernelError(f"{op}: sources[{k}] must be a 2-D tensor [T, H], got {what}")
    first = sources[0]
    for k, src in enumerate(sources[1:], start=1):
        if src.shape != first.shape:
            raise KernelError(
                f"{op}: sources[{k}] has shape {tuple(src.shape)} but sources[0] has "
                f"{tuple(first.shape)}; every source must be [T, H] with the same T and H "
                f"(check the layout: all captures come from one target)."
            )
        if src.dtype != first.dtype:
            raise KernelError(
                f"{op}: sources[{k}] is {src.dtype} but sources[0] is {first.dtype}; "
                f"cast the sources to one dtype (out_dtype= casts the result)."
            )
        if src.device != first.device:
            raise KernelError(
                f"{op}: sources[{k}] is on {src.device} but sources[0] is on "
                f"{first.device}; move every source to one device."
            )
    return sources


def _check_index(index: torch.Tensor, num_source_rows: int, device: torch.device,
                 op: str = "gather_concat") -> torch.Tensor:
    if not isinstance(index, torch.Tensor):
        raise KernelError(f"{op}: index must be a tensor [N], got {type(index).__name__}")
    if index.dtype not in (torch.int32, torch.int64):
        raise KernelError(f"{op}: index must be int32 or int64, got {index.dtype}")
    if index.dim() != 1:
        raise KernelError(f"{op}: index must be 1-D [N], got shape {tuple(index.shape)}")
    if index.device != device:
        raise KernelError(
            f"{op}: index is on {index.device} but the sources are on {device}; "
            f"move index to {device}."
        )
    # Range check only where it costs no device sync (CPU); on CUDA an
    # out-of-range index is a device-side error, as with torch.index_select.
    if index.device.type == "cpu" and index.numel() > 0:
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= num_source_rows:
            bad = low if low < 0 else high
            raise KernelError(
                f"{op}: index holds {bad}, outside [0, {num_source_rows}) (the sources "
                f"have T={num_source_rows} rows)."
            )
    return index.contiguous()


def _check_out(
    out: torch.Tensor | None,
    shape: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != shape:
        raise KernelError(f"gather_concat: out must be [N, K*H] = {list(shape)}, got {list(out.shape)}")
    if out.dtype != dtype:
        raise KernelError(
            f"gather_concat: out is {out.dtype} but the result is {dtype}; pass out_dtype={out.dtype} "
            f"or an out of dtype {dtype}."
        )
    if out.device != device:
        raise KernelError(f"gather_concat: out is on {out.device} but the sources are on {device}")
    return out


def _layout_problem(tensors: Sequence[torch.Tensor]) -> str | None:
    """Why the kernels cannot take these tensors as they are (torch can)."""
    for t in tensors:
        if t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
            return f"a tensor has inner stride {t.stride(1)} (kernels need 1)"
    return None


def gather_concat(
    sources: SourcesLike,
    index: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Gather rows of K hidden-state sources and concatenate them, in one pass.

    Args:
        sources: K tensors [T, H] (one dtype, one device), or one [K, T, H]
            tensor. Slot k of the result is sources[k] (layout order).
        index: [N] int32/int64 rows to take (repeats allowed); None = all T
            rows. Checked against T on CPU; on CUDA an out-of-range index is
            a device-side error, as with torch.index_select.
        out: optional preallocated [N, K*H] (inner stride 1) to write into.
        out_dtype: dtype of the result (default: the sources' dtype); the
            cast rounds to nearest even, exactly like Tensor.to.
        backend: "cuda", "triton" or "torch"; None = $EAGLE3_KERNEL_BACKEND
            or automatic (see eagle3_backend.ops.describe_backends()).

    Returns:
        out: [N, K*H] with out[:, k*H:(k+1)*H] = sources[k][index].
    """
    srcs = _as_source_list(sources)
    num_source_rows, hidden = srcs[0].shape
    device = srcs[0].device
    if index is not None:
        index = _check_index(index, num_source_rows, device)
    num_rows = num_source_rows if index is None else index.shape[0]
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None else srcs[0].dtype)
    out = _check_out(out, (num_rows, len(srcs) * hidden), dtype, device)  # [N, K*H]

    choice = _dispatch.resolve(
        "gather_concat",
        device,
        (srcs[0].dtype, out.dtype),
        backend,
        strict_layout=_layout_problem([*srcs, out]),
    )
    if choice.backend == "cuda":
        torch.ops.eagle3.gather_concat(srcs, index, out)
    elif choice.backend == "triton":
        from eagle3_backend.ops.triton import gather_concat as triton_gather

        triton_gather.gather_concat(srcs, index, out)
    else:
        reference.gather_concat_ref(srcs, index, out)
    return out


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
        backend: as for gather_concat.

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
        from eagle3_backend.ops.triton import gather_concat as triton_gather

        triton_gather.capture_into(buffer, slot, hidden, residual)
    else:
        reference.capture_into_ref(buffer, slot, hidden, residual)
    return buffer
