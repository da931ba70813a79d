"""Kernels of eagle3_backend, each with a torch reference, Triton and CUDA.

    capture_into(buffer, slot, hidden, residual=None, backend=None)
        -> writes hidden + residual into slot k of [T, K*H]  (capture_into.py)
    verify_tree_greedy(predicts, accept_index, accept_token_num, candidates,
        retrieve_index, retrieve_next_token, retrieve_next_sibling,
        target_predict, backend=None)                         (verify_tree.py)

Backend choice: explicit ``backend=`` > $EAGLE3_KERNEL_BACKEND > auto
(cuda extension > triton > torch); ``describe_backends()`` says which one
each op resolves to here and why (shown by ``eagle3 env``).
"""

from __future__ import annotations

import torch

from eagle3_backend.ops import _dispatch, _ext
from eagle3_backend.ops._dispatch import BACKENDS, ENV_VAR
from eagle3_backend.ops.capture_into import capture_into
from eagle3_backend.ops.table import OP_NAMES as OPS
from eagle3_backend.ops.verify_tree import VerifyOutputs, allocate_verify_outputs, verify_tree_greedy


def describe_backends(device: torch.device | str | None = None) -> dict[str, dict[str, str]]:
    """{op: {"backend": ..., "reason": ...}} for calls on ``device``.

    device defaults to cuda when a GPU is visible, else cpu. The reason names
    why each higher-ranked backend was skipped (extension not built, no
    CUDA tensors, TRITON_INTERPRET unset, ...).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    result = {}
    for op in OPS:
        resolution = _dispatch.describe(op, device)
        result[op] = {"backend": resolution.backend, "reason": resolution.reason}
    return result


def extension_status() -> dict[str, str | bool | None]:
    """Whether the compiled extension is loaded, from where, or why not."""
    loaded = _ext.available()
    return {"loaded": loaded, "origin": _ext.origin(), "error": None if loaded else _ext.load_error()}


__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "OPS",
    "VerifyOutputs",
    "allocate_verify_outputs",
    "capture_into",
    "describe_backends",
    "extension_status",
    "verify_tree_greedy",
]
