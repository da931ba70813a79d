"""KV-slot bookkeeping ops of SGLang's CPU engine and EAGLE worker, in torch.

``req_to_token: [R, C] int32`` maps (request pool row, token position) to a
KV-cache row; ``out_cache_loc`` vectors are int64. Every op is vectorized:
ragged per-request ranges become one flat gather or scatter.
"""

from __future__ import annotations

import torch


def _ragged(rows: torch.Tensor, start: torch.Tensor, end: torch.Tensor):
    """Flat (row, col) pairs for the ranges [start[i], end[i]) of each row[i].

    Returns (row_idx, col_idx, total), both [total] int64, in request order.
    """
    lens = (end.long() - start.long()).clamp_min(0)
    total = int(lens.sum())
    row_idx = rows.long().repeat_interleave(lens, output_size=total)
    first = torch.cumsum(lens, 0) - lens                      # exclusive prefix sum
    within = torch.arange(total, device=rows.device) - first.repeat_interleave(lens, output_size=total)
    col_idx = start.long().repeat_interleave(lens, output_size=total) + within
    return row_idx, col_idx, total


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """req_to_token[rpi[i], start[i]:end[i]] = next (end[i]-start[i]) entries of out_cache_loc."""
    rows, cols, total = _ragged(req_pool_indices, start_offset, end_offset)
    req_to_token[rows, cols] = out_cache_loc[:total].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """out_cache_loc = concat_i req_to_token[rpi[i], start[i]:end[i]] (int64)."""
    rows, cols, total = _ragged(req_pool_indices, start_offset, end_offset)
    out_cache_loc[:total] = req_to_token[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                           seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                                           pool_len: int, topk: int, num_steps: int) -> None:
    """out_cache_loc[i*topk*num_steps:...] = req_to_token[rpi[i], seq_lens[i] : + topk*num_steps]."""
    n = topk * num_steps
    bs = req_pool_indices.shape[0]
    # cols: [bs, n]
    cols = seq_lens.long().unsqueeze(1) + torch.arange(n, device=seq_lens.device)
    slots = req_to_token[req_pool_indices.long().unsqueeze(1), cols]
    out_cache_loc.view(bs, n).copy_(slots)


def build_draft_decode_metadata_cpu(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                    seq_lens: torch.Tensor, topk: int, num_steps: int,
                                    pool_len: int) -> torch.Tensor:
    """A req_to_token for multi-step draft decode, one row per (request, candidate).

    Row b*topk + t holds request b's committed prefix (seq_lens[b] slots)
    followed by candidate t's num_steps draft slots, which
    assign_draft_cache_locs_contiguous laid out at seq_lens[b] + t*num_steps.
    Returns [num_seqs*topk, pool_len] int32; entries past
    seq_lens[b] + num_steps are copies of the source row (unused).
    """
    rpi = req_pool_indices.long()
    out = req_to_token[rpi].repeat_interleave(topk, dim=0)            # [bs*topk, C]
    if num_steps == 0 or rpi.numel() == 0:
        return out
    steps = torch.arange(num_steps, device=rpi.device)
    cand = torch.arange(topk, device=rpi.device)
    sl = seq_lens.long()
    # src cols: [bs, topk, num_steps]; dst cols: [bs, 1, num_steps]
    src_cols = sl.view(-1, 1, 1) + cand.view(1, -1, 1) * num_steps + steps.view(1, 1, -1)
    dst_cols = (sl.view(-1, 1, 1) + steps.view(1, 1, -1)).expand_as(src_cols)
    src = req_to_token[rpi.view(-1, 1, 1), src_cols]                   # [bs, topk, num_steps]
    out_rows = torch.arange(out.shape[0], device=rpi.device).view(-1, topk, 1).expand_as(src_cols)
    out[out_rows, dst_cols] = src
    return out


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor,
                          bonus_tokens: torch.Tensor, accept_stride: int) -> None:
    """bonus_tokens[i] = accept_tokens.flat[i*accept_stride + accept_lens[i] - 1]."""
    bs = accept_lens.shape[0]
    idx = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor) -> None:
    """Compact the KV slots of accepted tokens: out_cache_loc at accept_index != -1, in order."""
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].long()
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept]
