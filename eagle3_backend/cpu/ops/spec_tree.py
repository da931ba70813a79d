"""EAGLE draft-tree ops: ``build_tree_kernel_efficient_cpu`` and ``verify_tree_greedy_cpu``.

Tree encoding (SGLang's): per request, node 0 is the verified root (the
bonus token); node i >= 1 is the draft token chosen by
``selected_index[b, i-1]``, an index into the flattened per-step top-k
candidates. Its parent is found through ``parent_list``: ``selected // topk``
names the parent's slot; slot 0 is the root, slot s > 0 is the candidate
``parent_list[b, s]``, i.e. the node whose ``selected_index`` equals it.
Children are linked as first-child / next-sibling lists
(``retrive_next_token`` / ``retrive_next_sibling``, -1 = none) in
ascending node order; ``retrive_index`` is the node's flat row b*n + i.

Trees are tiny (n <= a few dozen nodes per request), so the ops walk them in
plain Python on lists pulled out of the tensors in one copy each. Verify is
``eagle3_backend.ops``' torch reference, behind SGLang's CPU op signature.
"""

from __future__ import annotations

import torch

from eagle3_backend.ops.reference import verify_tree_greedy_ref

QLEN_ONLY = 1
FULL_MASK = 0


def _parents(parent_row: list[int], sel_row: list[int], topk: int, n: int) -> list[int]:
    """parent node of each node 1..n-1 (index 0 unused); -1 when it cannot be found."""
    parents = [-1] * n
    for i in range(1, n):
        slot = sel_row[i - 1] // topk
        if slot == 0:
            parents[i] = 0
            continue
        token = parent_row[slot]
        for p in range(n - 1):
            if sel_row[p] == token:
                parents[i] = p + 1
                break
    return parents


def build_tree_kernel_efficient_cpu(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                    verified_seq_len: torch.Tensor, tree_mask: torch.Tensor,
                                    positions: torch.Tensor, retrive_index: torch.Tensor,
                                    retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
                                    topk: int, depth: int, draft_token_num: int,
                                    tree_mask_mode: int) -> None:
    """Fill the verify tree's mask, positions and first-child/next-sibling links.

    parent_list: [bs, topk*(depth-1)+1], selected_index: [bs, n-1],
    verified_seq_len: [bs]; outputs positions [bs*n], retrive_*: [bs, n]
    (next_token / next_sibling must arrive filled with -1, as SGLang does).
    tree_mask, QLEN_ONLY (1): bool [bs*n*n], row i = nodes node i sees (itself
    and its ancestors). FULL_MASK (0): rows of seq_len+n per request, packed;
    only the n tree columns are written (SGLang pre-fills the prefix with True).
    """
    mode = int(tree_mask_mode)
    if mode not in (QLEN_ONLY, FULL_MASK):
        raise NotImplementedError(
            f"sgl_kernel::build_tree_kernel_efficient_cpu from eagle3_backend.cpu: "
            f"tree_mask_mode={mode} is not supported; expected 0 (FULL_MASK) or 1 (QLEN_ONLY).")
    n = draft_token_num
    bs = selected_index.shape[0]
    parents_all = parent_list.reshape(bs, -1).tolist()
    sel_all = selected_index.reshape(bs, -1).tolist()
    seq = verified_seq_len.tolist()
    nxt = retrive_next_token.reshape(bs, n).tolist()
    sib = retrive_next_sibling.reshape(bs, n).tolist()
    pos: list[int] = []
    mask_idx: list[int] = []
    mask_val: list[bool] = []
    full_off = 0
    for b in range(bs):
        parents = _parents(parents_all[b], sel_all[b], topk, n)
        for i in range(n - 1, 0, -1):
            p = parents[i]
            if p < 0:
                continue
            if nxt[b][p] != -1:
                sib[b][i] = nxt[b][p]
            nxt[b][p] = i
        for i in range(n):
            seen = {0}
            cur, d = i, 0
            while cur > 0:
                seen.add(cur)
                cur = parents[cur]
                d += 1
            pos.append(seq[b] + d)
            if mode == QLEN_ONLY:
                row0 = (b * n + i) * n
            else:
                row0 = full_off + (seq[b] + n) * i + seq[b]
            for j in range(n):
                mask_idx.append(row0 + j)
                mask_val.append(j in seen)
        full_off += n * (seq[b] + n)
    dev = positions.device
    positions.copy_(torch.tensor(pos, dtype=positions.dtype, device=dev))
    idx = torch.arange(bs * n, dtype=retrive_index.dtype, device=dev).view(bs, n)
    retrive_index.copy_(idx.view_as(retrive_index))
    retrive_next_token.copy_(torch.tensor(nxt, dtype=retrive_next_token.dtype, device=dev).view_as(retrive_next_token))
    retrive_next_sibling.copy_(torch.tensor(sib, dtype=retrive_next_sibling.dtype, device=dev).view_as(retrive_next_sibling))
    tree_mask[torch.tensor(mask_idx, dtype=torch.long, device=dev)] = torch.tensor(mask_val, dtype=torch.bool, device=dev)


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor,
                           accept_token_num: torch.Tensor, candidates: torch.Tensor,
                           retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                           retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """SGLang's CPU op signature over ``eagle3_backend.ops.reference.verify_tree_greedy_ref``,
    the one greedy tree verify of this package (the verifier calls it too)."""
    verify_tree_greedy_ref(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict)
