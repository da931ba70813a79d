"""Plain-torch references of every op in eagle3_backend.ops: the specification.

Each function here is what the Triton and CUDA kernels must reproduce bit for
bit. They run on any device (CPU included) and take already-validated inputs;
the public functions in ``capture_into.py`` / ``verify_tree.py`` validate.
"""

from __future__ import annotations

import torch


def capture_into_ref(
    buffer: torch.Tensor,
    slot: int,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """buffer[:, slot*H:(slot+1)*H] = (hidden + residual).to(buffer.dtype).

    hidden, residual: [T, H] of one dtype (the sum is rounded to that dtype
    first, exactly as the model's own ``hidden + residual`` would be);
    buffer: [T, K*H]. ``residual=None`` copies ``hidden``.
    """
    width = hidden.shape[1]
    value = hidden if residual is None else hidden + residual  # [T, H]
    buffer[:, slot * width : (slot + 1) * width].copy_(value.to(buffer.dtype))
    return buffer


def greedy_path(tokens: list[int], first_child: list[int], next_sibling: list[int],
                target: list[int], max_accept: int) -> list[int]:
    """One request's greedy walk (the rule :func:`verify_tree_greedy_ref` states), on host
    lists: node i holds draft token ``tokens[i]``, ``target[i]`` is the target's token after
    node i. Returns the accepted nodes, the root (node 0) first, at most ``max_accept``."""
    path = [0]
    node = 0
    while len(path) < max_accept:
        want = target[node]
        child = first_child[node]
        while child != -1 and tokens[child] != want:
            child = next_sibling[child]
        if child == -1:
            break
        path.append(child)
        node = child
    return path


def verify_tree_greedy_ref(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance over a draft token tree (SGLang's verify_tree_greedy).

    Shapes (B requests, D draft tokens per request including the root, S =
    the most tokens one request can accept, i.e. tree depth + 1):
      candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
      target_predict: [B, D] int64. Node i of request b holds draft token
      candidates[b, i]; its first child is retrieve_next_token[b, i] and its
      next sibling retrieve_next_sibling[b, i] (-1 = none); node 0 is the
      root (the last verified token). retrieve_index[b, i] is the node's row
      in the flattened [B*D] verify batch; target_predict.view(-1)[r] is the
      target's greedy token after row r.
      predicts: [B*D] int32, accept_index: [B, S] int32, accept_token_num:
      [B] int32; all three are written in place (only the entries named
      below: others keep the caller's fill, -1 for accept_index in SGLang).

    Per request: start at the root; at each of up to S-1 levels, walk the
    children of the last accepted node in sibling order and accept the first
    whose draft token equals the target's token after the last accepted
    node; stop at the first level where none matches. Then
      predicts[r] = target token after row r, for every accepted row r
        (the root included), i.e. the tokens the target commits;
      accept_index[b, :n+1] = rows of the root and the n accepted nodes;
      accept_token_num[b] = n (accepted draft tokens, the root not counted).
    """
    cand = candidates.tolist()
    rows = retrieve_index.tolist()
    first_child = retrieve_next_token.tolist()
    next_sibling = retrieve_next_sibling.tolist()
    target_flat = target_predict.reshape(-1).tolist()
    max_accept = accept_index.shape[1]
    new_predicts: dict[int, int] = {}
    new_accept: list[list[int]] = []
    num_accepted: list[int] = []
    for b in range(len(cand)):
        target_row = [target_flat[r] for r in rows[b]]
        nodes = greedy_path(cand[b], first_child[b], next_sibling[b], target_row, max_accept)
        accepted = [rows[b][node] for node in nodes]
        for r in accepted:
            new_predicts[r] = target_flat[r]
        new_accept.append(accepted)
        num_accepted.append(len(accepted) - 1)

    if new_predicts:
        where = torch.tensor(list(new_predicts), dtype=torch.long, device=predicts.device)
        what = torch.tensor(list(new_predicts.values()), dtype=predicts.dtype)
        predicts.index_copy_(0, where, what.to(predicts.device))
    for b, accepted in enumerate(new_accept):
        accept_index[b, : len(accepted)] = torch.tensor(accepted, dtype=accept_index.dtype)
    accept_token_num.copy_(torch.tensor(num_accepted, dtype=accept_token_num.dtype))
    return predicts, accept_index, accept_token_num
