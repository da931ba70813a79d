"""Plain-loop references for the CPU ops (the spec the tests hold them to).

Written for clarity, not speed: one request, one query, one head at a time,
softmax in float64, trees walked through explicit parent arrays. Every
function returns fresh outputs instead of writing into SGLang's buffers.
"""

from __future__ import annotations

import math

import torch


def attention_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                  logit_cap: float = 0.0, sink: float | None = None) -> torch.Tensor:
    """One query head over its visible keys. q: [D], keys: [L, D], values: [L, Dv] -> [Dv] f64."""
    s = [float(torch.dot(q.double(), k.double())) * scale for k in keys]
    if logit_cap > 0:
        s = [logit_cap * math.tanh(x / logit_cap) for x in s]
    m = max(s + ([sink] if sink is not None else []))
    w = [math.exp(x - m) for x in s]
    denom = sum(w) + (math.exp(sink - m) if sink is not None else 0.0)
    out = torch.zeros(values.shape[-1], dtype=torch.float64)
    for wi, v in zip(w, values):
        out += (wi / denom) * v.double()
    return out


def extend_attention(q_extend, k_extend, v_extend, k_buffer, v_buffer, req_to_token,
                     req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, sm_scale,
                     logit_cap=0.0, window_plus_one=0, sinks=None, tree_mask=None,
                     is_causal=True) -> torch.Tensor:
    """[N, Hq, Dv] float64: each extend query over its prefix (from the cache) and extend keys."""
    n, hq, _ = q_extend.shape
    hkv = k_buffer.shape[1]
    out = torch.zeros(n, hq, v_buffer.shape[-1], dtype=torch.float64)
    tree_off = 0
    for b in range(len(seq_lens)):
        e, total, s0 = int(extend_seq_lens[b]), int(seq_lens[b]), int(extend_start_loc[b])
        prefix = total - e
        slots = [int(req_to_token[int(req_pool_indices[b]), j]) for j in range(prefix)]
        for i in range(e):
            qpos = prefix + i
            for h in range(hq):
                kh = h // (hq // hkv)
                keys, vals = [], []
                for j in range(total):
                    if j < prefix:
                        visible = (not is_causal) or j <= qpos
                    elif tree_mask is not None:
                        visible = bool(tree_mask[tree_off + i * e + (j - prefix)])
                    else:
                        visible = (not is_causal) or j <= qpos
                    if window_plus_one > 0 and qpos - j >= window_plus_one:
                        visible = False
                    if not visible:
                        continue
                    if j < prefix:
                        keys.append(k_buffer[slots[j], kh]); vals.append(v_buffer[slots[j], kh])
                    else:
                        keys.append(k_extend[s0 + j - prefix, kh]); vals.append(v_extend[s0 + j - prefix, kh])
                sink = float(sinks[h]) if sinks is not None else None
                out[s0 + i, h] = attention_row(q_extend[s0 + i, h], torch.stack(keys), torch.stack(vals),
                                               sm_scale, logit_cap, sink)
        if tree_mask is not None:
            tree_off += e * e
    return out


def decode_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale,
                     logit_cap=0.0, window_plus_one=0, sinks=None) -> torch.Tensor:
    """[B, Hq, Dv] float64: the one query of each request over its whole sequence in the cache."""
    bsz, hq, _ = query.shape
    hkv = k_cache.shape[1]
    out = torch.zeros(bsz, hq, v_cache.shape[-1], dtype=torch.float64)
    for b in range(bsz):
        total = int(seq_lens[b])
        qpos = total - 1
        slots = [int(req_to_token[int(req_pool_indices[b]), j]) for j in range(total)
                 if not (window_plus_one > 0 and qpos - j >= window_plus_one)]
        for h in range(hq):
            kh = h // (hq // hkv)
            sink = float(sinks[h]) if sinks is not None else None
            out[b, h] = attention_row(query[b, h], k_cache[slots, kh], v_cache[slots, kh],
                                      sm_scale, logit_cap, sink)
    return out


def tree_parents(parent_list: list[int], selected_index: list[int], topk: int) -> list[int]:
    """Parent node per node of one request's draft tree (node 0 = root, parent -1)."""
    node_of_candidate = {c: i + 1 for i, c in enumerate(selected_index)}
    parents = [-1]
    for c in selected_index:
        slot = c // topk
        parents.append(0 if slot == 0 else node_of_candidate[parent_list[slot]])
    return parents


def build_tree(parent_list, selected_index, verified_seq_len, topk: int, n: int):
    """(mask [bs, n, n] bool, positions [bs*n], next_token [bs, n], next_sibling [bs, n])."""
    bs = len(verified_seq_len)
    mask = torch.zeros(bs, n, n, dtype=torch.bool)
    positions, nxt, sib = [], [], []
    for b in range(bs):
        parents = tree_parents(list(parent_list[b]), list(selected_index[b]), topk)
        children = [[c for c in range(n) if parents[c] == p] for p in range(n)]
        nxt.append([ch[0] if ch else -1 for ch in children])
        row_sib = [-1] * n
        for ch in children:
            for a, c in zip(ch, ch[1:]):
                row_sib[a] = c
        sib.append(row_sib)
        for i in range(n):
            depth, cur = 0, i
            while cur != -1:
                mask[b, i, cur] = True
                cur = parents[cur]
                depth += 1
            positions.append(int(verified_seq_len[b]) + depth - 1)
    return mask, positions, nxt, sib


def verify_greedy(candidates, parents_per_req, target_predict, steps: int):
    """Greedy accept along the tree. Returns (accept_index [bs, steps] (-1 padded), num [bs],
    predicts {flat index: token}).

    candidates / target_predict: [bs][n] lists; parents_per_req: [bs][n] parent node lists.
    """
    bs = len(candidates)
    n = len(candidates[0])
    accept = [[-1] * steps for _ in range(bs)]
    nums, predicts = [], {}
    for b in range(bs):
        node, path = 0, [0]
        while len(path) < steps:
            kids = [c for c in range(1, n) if parents_per_req[b][c] == node]
            nxt = next((c for c in kids if candidates[b][c] == target_predict[b][node]), None)
            if nxt is None:
                break
            predicts[b * n + node] = target_predict[b][node]
            path.append(nxt)
            node = nxt
        predicts[b * n + node] = target_predict[b][node]
        for k, p in enumerate(path):
            accept[b][k] = b * n + p
        nums.append(len(path) - 1)
    return accept, nums, predicts
