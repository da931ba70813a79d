"""fused_fc: the draft's fc layer on K gathered hidden states (experimental).

    out = gather_concat(sources, index) @ weight.T (+ bias)        # [N, D]

Two backends:
  "torch"   gather_concat (auto dispatch: CUDA extension, Triton or torch)
            then the matmul (``torch.addmm``, cuBLAS on GPU). The default.
  "triton"  one Triton GEMM that reads its K-blocks straight from the K
            sources with the row gather (ops/triton/fused_fc.py): the
            [N, K*H] fc input never exists.

The fused kernel saves the concat's memory traffic, which is small next to
the GEMM itself (at N=8,192, K=3, H=D=7168 bf16: about 0.7 GB moved
against 2.5 TFLOP), and it competes with cuBLAS on the GEMM. It becomes
the default only where ``benchmarks/bench_gather_concat.py`` shows it
faster on a GPU; until then it is opt-in with ``backend="triton"``. The two
backends agree to fp32-accumulation rounding, not bit for bit.
"""

from __future__ import annotations

import torch

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _dispatch
from eagle3_backend.ops.gather_concat import SourcesLike, _as_source_list, _check_index, gather_concat

FC_BACKENDS = ("torch", "triton")
_OP = "fused_fc"


def _check_weight(weight: torch.Tensor, bias: torch.Tensor | None, first: torch.Tensor, num_sources: int) -> None:
    width = num_sources * first.shape[1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise KernelError(f"{_OP}: weight must be a 2-D tensor [D, K*H], got {getattr(weight, 'shape', weight)}")
    if weight.shape[1] != width:
        raise KernelError(
            f"{_OP}: weight is {list(weight.shape)} but {num_sources} sources of width {first.shape[1]} "
            f"make an fc input {width} wide; the fc weight must be [D, {width}] (check that the "
            f"draft's layout has as many captures as sources passed)."
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != first.dtype:
            raise KernelError(f"{_OP}: {name} is {t.dtype} but the sources are {first.dtype}; cast one to the other.")
        if t.device != first.device:
            raise KernelError(f"{_OP}: {name} is on {t.device} but the sources are on {first.device}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise KernelError(f"{_OP}: bias must be [D] = [{weight.shape[0]}], got {list(bias.shape)}")


def fused_fc(
    sources: SourcesLike,
    weight: torch.Tensor,
    index: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """The draft fc applied to gathered, concatenated hidden states.

    Args:
        sources: K tensors [T, H] (one dtype and device), or one [K, T, H]
            tensor, in layout order.
        weight: [D, K*H] fc weight, the sources' dtype and device.
        index: [N] int32/int64 rows to take (repeats allowed); None = all T.
        bias: optional [D].
        out: optional preallocated [N, D] of the sources' dtype.
        backend: "torch" (default: gather_concat + F.linear) or "triton"
            (concat-free GEMM; CUDA tensors, or CPU under TRITON_INTERPRET=1).

    Returns:
        out: [N, D] = concat_k(sources[k][index]) @ weight.T + bias.
    """
    srcs = _as_source_list(sources, _OP)
    first = srcs[0]
    _check_weight(weight, bias, first, len(srcs))
    if index is not None:
        index = _check_index(index, first.shape[0], first.device, _OP)
    num_rows = first.shape[0] if index is None else index.shape[0]
    shape = (num_rows, weight.shape[0])
    if out is None:
        out = torch.empty(shape, dtype=first.dtype, device=first.device)
    elif tuple(out.shape) != shape or out.dtype != first.dtype or out.device != first.device:
        raise KernelError(
            f"{_OP}: out must be {list(shape)} {first.dtype} on {first.device}, got "
            f"{list(out.shape)} {out.dtype} on {out.device}"
        )

    name = backend or "torch"
    if name not in FC_BACKENDS:
        raise KernelError(f"{_OP}: backend must be one of {FC_BACKENDS}, got {backend!r}")
    if name == "triton":
        why = _dispatch._why_not("triton", first.device, (first.dtype,))
        if why is None:  # triton is installed
            from eagle3_backend.ops.triton import fused_fc as triton_fc

            if len(srcs) > triton_fc.MAX_SOURCES:
                why = f"{len(srcs)} sources; the kernel takes at most {triton_fc.MAX_SOURCES}"
        tensors = [*srcs, weight, out] + ([bias] if bias is not None else [])
        if why is None and any(t.stride(-1) != 1 and t.shape[-1] > 1 for t in tensors):
            why = "a tensor has a non-unit inner stride (the kernel needs 1)"
        if why is not None:
            raise KernelError(f"{_OP}: backend='triton' cannot run this call: {why}. Use backend='torch'.")
        return triton_fc.fused_fc(srcs, index, weight, bias, out)  # bias, if any, has unit stride (checked)
    fc_input = gather_concat(srcs, index)  # [N, K*H]
    if bias is None:
        return torch.mm(fc_input, weight.t(), out=out)
    return torch.addmm(bias, fc_input, weight.t(), out=out)
