"""Triton kernel for greedy tree verification (spec: reference.verify_tree_greedy_ref).

One program per request walks the tree sequentially: every level depends on
the token accepted at the previous one. Scalars only, no shared memory.
Kernel bodies call Triton builtins only (tl.full, not tl.zeros): the
standard-library helpers are jit functions fixed at triton's import to either
compiled or interpreted mode, and would break the other one.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl


def _verify_tree_greedy_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    candidates_ptr,
    retrieve_index_ptr,
    next_token_ptr,
    next_sibling_ptr,
    target_ptr,
    num_draft,
    max_accept,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * num_draft
    last_row = tl.load(retrieve_index_ptr + base)
    tl.store(accept_index_ptr + b * max_accept, last_row.to(tl.int32))
    node = tl.full((), 0, dtype=tl.int64)
    num_accepted = tl.full((), 0, dtype=tl.int32)
    level = 1
    searching = max_accept > 1
    while searching:
        want = tl.load(target_ptr + last_row)
        child = tl.load(next_token_ptr + base + node)
        matched = tl.full((), 0, dtype=tl.int1)
        while (child != -1) & (matched == 0):
            matched = tl.load(candidates_ptr + base + child) == want
            child = tl.where(matched, child, tl.load(next_sibling_ptr + base + child))
        if matched:
            tl.store(predicts_ptr + last_row, want.to(tl.int32))
            last_row = tl.load(retrieve_index_ptr + base + child)
            num_accepted += 1
            tl.store(accept_index_ptr + b * max_accept + num_accepted, last_row.to(tl.int32))
            node = child
        level += 1
        searching = matched & (level < max_accept)
    tl.store(accept_token_num_ptr + b, num_accepted)
    tl.store(predicts_ptr + last_row, tl.load(target_ptr + last_row).to(tl.int32))


@functools.cache
def compiled(interpret: bool):
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_verify_tree_greedy_kernel)
    from triton.runtime.jit import JITFunction

    return JITFunction(_verify_tree_greedy_kernel, do_not_specialize=["num_draft", "max_accept"])


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Validated inputs (see ops/verify_tree.py); writes the three outputs."""
    batch, num_draft = candidates.shape
    kernel = compiled(candidates.device.type != "cuda")
    kernel[(batch,)](
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        target_predict,
        num_draft,
        accept_index.shape[1],
        num_warps=1,
    )
