"""verify_tree_greedy: greedy acceptance over a draft token tree.

Same contract as SGLang's ``verify_tree_greedy`` (sgl_kernel), so the SGLang
plugin can call it where sgl-kernel builds are missing or broken (sm_120);
our argument names spell ``retrieve_*`` where SGLang spells ``retrive_*``.
The specification is ``reference.verify_tree_greedy_ref``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _dispatch, reference


class VerifyOutputs(NamedTuple):
    """predicts [B*D] int32, accept_index [B, S] int32, accept_token_num [B] int32."""

    predicts: torch.Tensor
    accept_index: torch.Tensor
    accept_token_num: torch.Tensor


def allocate_verify_outputs(batch: int, num_draft: int, max_accept: int, device: torch.device | str) -> VerifyOutputs:
    """Outputs filled the way SGLang fills them: predicts 0, accept_index -1, counts 0."""
    return VerifyOutputs(
        torch.zeros(batch * num_draft, dtype=torch.int32, device=device),
        torch.full((batch, max_accept), -1, dtype=torch.int32, device=device),
        torch.zeros(batch, dtype=torch.int32, device=device),
    )


def _check(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    tree: dict[str, torch.Tensor],
) -> None:
    candidates = tree["candidates"]
    if candidates.dim() != 2:
        raise KernelError(f"verify_tree_greedy: candidates must be [batch, num_draft], got {tuple(candidates.shape)}")
    batch, num_draft = candidates.shape
    device = candidates.device
    for name, t in tree.items():
        if t.dtype != torch.int64:
            raise KernelError(f"verify_tree_greedy: {name} must be int64, got {t.dtype}")
        if tuple(t.shape) != (batch, num_draft):
            raise KernelError(
                f"verify_tree_greedy: {name} must be [{batch}, {num_draft}] like candidates, got {tuple(t.shape)}"
            )
    expected = {
        "predicts": (predicts, (batch * num_draft,)),
        "accept_index": (accept_index, None),
        "accept_token_num": (accept_token_num, (batch,)),
    }
    for name, (t, shape) in expected.items():
        if t.dtype != torch.int32:
            raise KernelError(f"verify_tree_greedy: {name} must be int32, got {t.dtype}")
        if shape is not None and tuple(t.shape) != shape:
            raise KernelError(f"verify_tree_greedy: {name} must be {list(shape)}, got {list(t.shape)}")
        if not t.is_contiguous():
            raise KernelError(f"verify_tree_greedy: {name} must be contiguous (it is written in place)")
    if accept_index.dim() != 2 or accept_index.shape[0] != batch or accept_index.shape[1] < 1:
        raise KernelError(
            f"verify_tree_greedy: accept_index must be [{batch}, max_accept >= 1], got {tuple(accept_index.shape)}"
        )
    for name, t in (*tree.items(), ("predicts", predicts), ("accept_index", accept_index),
                    ("accept_token_num", accept_token_num)):
        if t.device != device:
            raise KernelError(f"verify_tree_greedy: {name} is on {t.device} but candidates is on {device}")


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    backend: str | None = None,
) -> VerifyOutputs:
    """Accept the longest tree path whose draft tokens equal the target's argmax.

    Args (B requests, D tree nodes per request, S = max accepted + 1):
        predicts: [B*D] int32, written: the target's token after each
            accepted row (the root included).
        accept_index: [B, S] int32, written: rows of the root and the
            accepted nodes in the flattened verify batch; later entries keep
            the caller's fill (-1 from allocate_verify_outputs).
        accept_token_num: [B] int32, written: accepted draft tokens per request.
        candidates: [B, D] int64 draft token of each node (node 0 = root).
        retrieve_index: [B, D] int64 node -> row in the [B*D] verify batch.
        retrieve_next_token: [B, D] int64 first child of a node, -1 = leaf.
        retrieve_next_sibling: [B, D] int64 next sibling, -1 = last.
        target_predict: [B, D] int64 target argmax at each row.
        backend: "cuda", "triton" or "torch"; None = env or automatic.

    Returns:
        (predicts, accept_index, accept_token_num), the same tensors.

    On CUDA, no host sync. The torch backend walks the tree on the host.
    """
    tree = {
        "candidates": candidates,
        "retrieve_index": retrieve_index,
        "retrieve_next_token": retrieve_next_token,
        "retrieve_next_sibling": retrieve_next_sibling,
        "target_predict": target_predict,
    }
    _check(predicts, accept_index, accept_token_num, tree)
    args = (predicts, accept_index, accept_token_num, *tree.values())
    choice = _dispatch.resolve("verify_tree_greedy", candidates.device, (), backend)
    if candidates.shape[0] == 0:
        return VerifyOutputs(predicts, accept_index, accept_token_num)
    if choice.backend == "cuda":
        torch.ops.eagle3.verify_tree_greedy(*args)
    elif choice.backend == "triton":
        from eagle3_backend.ops.triton import verify_tree as triton_verify

        triton_verify.verify_tree_greedy(*args)
    else:
        reference.verify_tree_greedy_ref(*args)
    return VerifyOutputs(predicts, accept_index, accept_token_num)
