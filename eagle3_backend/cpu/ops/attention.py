"""Paged attention for SGLang's CPU engine, in torch: ``extend_attention_cpu`` and
``decode_attention_cpu`` (the two ops SGLang's ``intel_amx`` attention backend calls).

KV cache layout (SGLang's MHA token pool): ``k_buffer: [S, Hkv, D]``,
``v_buffer: [S, Hkv, Dv]``; request ``b``'s token ``j`` lives at row
``req_to_token[req_pool_indices[b], j]``.

Masking rules, for a query at absolute position ``p`` and a key at ``k``:
- causal: ``k <= p``; a verify tree mask replaces the rule inside the extend
  block (prefix keys stay visible);
- sliding window (``window_plus_one > 0``): ``p - k < window_plus_one``
  (SGLang passes ``layer.sliding_window_size + 1``; ``-1 + 1 = 0`` means off);
- logit cap ``c > 0``: ``s = c * tanh(s / c)`` after scaling;
- sinks ``[Hq]``: one extra logit per head in the softmax denominator only.

Served steps (fp32 or bf16 cache, no sinks, no fp8 scale) go to the C++ kernel
``kernels/paged_attention.cpp``, which reads each key and value where it lies in the
cache (``EAGLE3_CPU_ATTENTION_KERNEL=0`` keeps the torch path below; so does a build
that failed). The torch path is vectorized over heads, queries and keys (two batched
matmuls and a softmax, grouped KV heads never copied per query head); decode is also
vectorized over requests (keys padded to the longest one), extend loops over
requests. Scores and softmax run in fp32 whatever the cache dtype. Very long
extends (queries x keys above ``SDPA_MIN_SCORES``) go to torch's fused SDPA
instead, which never materializes the score matrix.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

_NEG_INF = float("-inf")
SDPA_MIN_SCORES = 1 << 16  # queries x keys of one request from which extend uses fused SDPA
KERNEL_ENV = "EAGLE3_CPU_ATTENTION_KERNEL"
_kernel_state: dict[str, object] = {}
_decode_meta: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def kernel():
    """The built module holding ``paged_attention``, or None (``KERNEL_ENV=0``, or the
    build failed: ``small_gemm.load`` logs why). Decided once per process."""
    if "module" not in _kernel_state:
        from eagle3_backend.cpu import small_gemm

        _kernel_state["module"] = small_gemm.load() if os.environ.get(KERNEL_ENV, "1") != "0" else None
    return _kernel_state["module"]


def _kernel_takes(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                  out: torch.Tensor, k_new: torch.Tensor | None, key_scale: float,
                  value_scale: float, sinks: torch.Tensor | None) -> bool:
    dt = q.dtype
    return (dt in (torch.float32, torch.bfloat16) and sinks is None
            and key_scale == 1.0 and value_scale == 1.0
            and k_buffer.dtype == dt and v_buffer.dtype == dt and out.dtype == dt
            and q.shape[-1] == k_buffer.shape[-1] and out.shape[-1] == v_buffer.shape[-1]
            and (k_new is None or (k_new.dtype == dt and k_new.shape[1:] == k_buffer.shape[1:])))


_dense_rows: dict[str, torch.Tensor] = {}


def attend_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: torch.Tensor | None,
                 scale: float) -> torch.Tensor | None:
    """The kernel's attention for one sequence whose keys lie in order in a dense cache (the
    offline verifier's transformers target): T new queries q [T, Hq, D] over k [L, Hkv, D],
    v [L, Hkv, D] (any strides with the head dim contiguous), the last T keys the queries'
    own. Every query sees the first L - T keys; among its own, those ``block`` (bool [T, T],
    True = attend: a verify tree) or, when None, causality allows. Returns [T, Hq, D] in
    q's dtype, or None when the kernel is unavailable or does not take these operands (the
    caller keeps its own path). Each row's result is the same bit for bit whatever the other
    rows are, as in a served step."""
    mod = kernel()
    t, L = q.shape[0], k.shape[0]
    if (mod is None or q.dim() != 3 or k.dim() != 3 or v.shape[-1] != q.shape[-1] or t > L
            or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1] != 0
            or not _kernel_takes(q, k, v, q, None, 1.0, 1.0, None)):
        return None
    rows = _dense_rows.get("rows")
    if rows is None or rows.numel() < L:
        rows = _dense_rows["rows"] = torch.arange(max(L, 4096), dtype=torch.int32)
    out = q.new_empty(q.shape)
    zero = torch.zeros(1, dtype=torch.int64)
    mod.paged_attention(q, out, k, v, None, None, rows[:L].view(1, L), zero,
                        torch.tensor([L]), torch.tensor([t]), zero,
                        None if block is None else block.reshape(-1), True, scale, 0.0, 0)
    return out


def _softmax(s: torch.Tensor, logit_cap: float, sinks: torch.Tensor | None,
             mask: torch.Tensor | None) -> torch.Tensor:
    """Attention weights from scaled fp32 scores s: [..., Hkv, G, M, L].

    mask broadcastable to s (True = attend); sinks [Hkv*G] add one logit per
    query head to the denominator only.
    """
    if logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    if mask is not None:
        s = s.masked_fill(~mask, _NEG_INF)
    if sinks is None:
        return torch.softmax(s, dim=-1)
    hkv, g = s.shape[-4], s.shape[-3]
    sink = sinks.float().view(hkv, g, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                scale: float, logit_cap: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """One request: M queries over L keys with grouped KV heads.

    q: [M, Hq, D], k: [L, Hkv, D], v: [L, Hkv, Dv], mask: bool [M, L'] or None
    (True = attend); a mask narrower than L (L' < L) covers the last L' keys,
    the earlier ones being visible to every query. Returns [M, Hq, Dv] in q's dtype.
    """
    m, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    # the G query heads of a KV head share its keys: fold them into the rows
    qf = q.float().view(m, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * m, d)   # [Hkv, G*M, D]
    s = torch.bmm(qf, k.float().permute(1, 2, 0)) * scale                          # [Hkv, G*M, L]
    s = s.view(hkv, g, m, -1)
    if logit_cap > 0:  # before any masking: the cap must not turn -inf into -cap
        s = logit_cap * torch.tanh(s / logit_cap)
    if mask is not None and mask.shape[-1] < s.shape[-1]:
        s[..., s.shape[-1] - mask.shape[-1]:].masked_fill_(~mask, _NEG_INF)
        mask = None
    p = _softmax(s, 0.0, sinks, mask)                                              # [Hkv, G, M, L]
    out = torch.bmm(p.view(hkv, g * m, -1), v.float().transpose(0, 1))             # [Hkv, G*M, Dv]
    return out.view(hkv, g, m, -1).permute(2, 0, 1, 3).reshape(m, hq, v.shape[-1]).to(q.dtype)


def _sdpa_rows(q, k, v, mask, scale):
    # q: [M, Hq, D], k/v: [L, Hkv, D|Dv], mask [M, L] -> [M, Hq, Dv]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0).to(q.dtype),
        v.transpose(0, 1).unsqueeze(0).to(q.dtype), attn_mask=mask.view(1, 1, *mask.shape),
        scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)


def _read_cache(buf: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
    # rows: [...] int64 -> [..., H, D]; fp8 caches are dequantized with their scale.
    # index_select, not buf[rows]: advanced indexing is ~8x slower for this gather.
    x = buf.index_select(0, rows.reshape(-1)).view(*rows.shape, *buf.shape[1:])
    if scale != 1.0:
        x = x.float() * scale
    return x


def _check_supported(is_cross_attention: bool, op: str) -> None:
    if is_cross_attention:
        raise NotImplementedError(
            f"sgl_kernel::{op} from eagle3_backend.cpu: cross attention "
            "(is_cross_attention=True) is not implemented; expected a decoder-only "
            "model. Serve encoder-decoder models on a GPU.")


def _check_prefix_layout(k_extend: torch.Tensor, v_extend: torch.Tensor, k_buffer: torch.Tensor,
                         v_buffer: torch.Tensor) -> None:
    if k_extend.shape[1:] != k_buffer.shape[1:] or v_extend.shape[1:] != v_buffer.shape[1:]:
        raise NotImplementedError(
            f"sgl_kernel::extend_attention_cpu from eagle3_backend.cpu: new keys/values "
            f"{tuple(k_extend.shape[1:])}/{tuple(v_extend.shape[1:])} per token but the KV cache holds "
            f"{tuple(k_buffer.shape[1:])}/{tuple(v_buffer.shape[1:])} (an MLA latent cache under an MHA "
            f"extend) with a cached prefix to attend to; expected the absorbed-MLA path for extends "
            f"over a prefix. Serve this model with --disable-radix-cache --chunked-prefill-size -1.")


def _extend_mask(e: int, prefix: int, is_causal: bool, window_plus_one: int,
                 block: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """mask [E, prefix + E] or, when the whole prefix is visible, [E, E] over the
    extend block only (True = attend); None when every key is visible."""
    if window_plus_one <= 0:
        if block is not None:
            return block
        if not is_causal:
            return None
        return torch.ones(e, e, dtype=torch.bool, device=device).tril_()
    qpos = torch.arange(prefix, prefix + e, device=device).unsqueeze(1)
    kpos = torch.arange(prefix + e, device=device).unsqueeze(0)
    mask = (kpos <= qpos) if is_causal else torch.ones(e, prefix + e, dtype=torch.bool, device=device)
    if block is not None:
        mask[:, prefix:] = block
    if window_plus_one > 0:
        mask &= (qpos - kpos) < window_plus_one
    return mask


def extend_attention_cpu(
    q_extend: torch.Tensor, k_extend: torch.Tensor | None, v_extend: torch.Tensor | None,
    o_extend: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    key_scale: float, value_scale: float, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor, max_len_extend: int, sm_scale: float, logit_cap: float,
    is_cross_attention: bool, window_plus_one: int, encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None, tree_mask: torch.Tensor | None, is_causal: bool,
) -> None:
    """Attention of each request's new tokens over its cached prefix and themselves.

    q_extend: [N, Hq, D]; k_extend/v_extend: [N, Hkv, D|Dv] or None (then the
    extend K/V are read back from the cache); o_extend: [N, Hq, Dv] (written).
    seq_lens include the extend tokens. tree_mask (verify, QLEN_ONLY layout):
    bool [B * E * E], row i of request b says which of its E extend tokens
    query i sees.
    """
    _check_supported(is_cross_attention, "extend_attention_cpu")
    seq = seq_lens.tolist()
    ext = extend_seq_lens.tolist()
    mod = kernel()
    if (mod is not None and max(e * t for e, t in zip(ext, seq)) < SDPA_MIN_SCORES
            and _kernel_takes(q_extend, k_buffer, v_buffer, o_extend, k_extend, key_scale,
                              value_scale, sinks)
            and (k_extend is None) == (v_extend is None)):
        mod.paged_attention(q_extend, o_extend, k_buffer, v_buffer, k_extend, v_extend, req_to_token,
                            req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, tree_mask,
                            is_causal, sm_scale, logit_cap, window_plus_one)
        return
    start = extend_start_loc.tolist()
    rpi = req_pool_indices.tolist()
    tree_off = 0
    for b in range(len(seq)):
        e, total, s0 = int(ext[b]), int(seq[b]), int(start[b])
        if e == 0:
            continue
        prefix = total - e
        if k_extend is None:
            rows = req_to_token[rpi[b], :total].long()
            k = _read_cache(k_buffer, rows, key_scale)
            v = _read_cache(v_buffer, rows, value_scale)
        elif prefix == 0:
            # nothing cached yet: the new K/V are all there is. (DeepSeek's MHA prefill passes
            # k [N, H, 192] while its cache holds the MLA latent [S, 1, 576]: never read here.)
            k, v = k_extend[s0:s0 + e], v_extend[s0:s0 + e]
        else:
            _check_prefix_layout(k_extend, v_extend, k_buffer, v_buffer)
            rows = req_to_token[rpi[b], :prefix].long()
            k_new, v_new = k_extend[s0:s0 + e], v_extend[s0:s0 + e]
            kp, vp = _read_cache(k_buffer, rows, key_scale), _read_cache(v_buffer, rows, value_scale)
            k = torch.cat([kp, k_new.to(kp.dtype)])                       # [prefix+E, Hkv, D]
            v = torch.cat([vp, v_new.to(vp.dtype)])
        block = None
        if tree_mask is not None:
            block = tree_mask[tree_off:tree_off + e * e].view(e, e)
            tree_off += e * e
        mask = _extend_mask(e, prefix, is_causal, window_plus_one, block, q_extend.device)
        q = q_extend[s0:s0 + e]
        if e * total >= SDPA_MIN_SCORES and logit_cap <= 0 and sinks is None:
            full = torch.ones(e, total, dtype=torch.bool, device=q.device)
            if mask is not None:
                full[:, total - mask.shape[-1]:] = mask
            mask = full
            out = _sdpa_rows(q, k, v, mask, sm_scale)
        else:
            out = attend_rows(q, k, v, mask, sm_scale, logit_cap, sinks)
        o_extend[s0:s0 + e] = out


def decode_attention_cpu(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    key_scale: float, value_scale: float, output: torch.Tensor,
    key: torch.Tensor | None, value: torch.Tensor | None, loc: torch.Tensor,
    attn_logits: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float, logit_cap: float, is_cross_attention: bool,
    window_plus_one: int, encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None,
) -> None:
    """One new query per request over its whole sequence, new K/V included.

    query: [B, Hq, D]; output: [B, Hq, Dv] (written). When key/value
    ([B, Hkv, D|Dv]) are given they are first stored at k_cache[loc] and
    v_cache[loc]. seq_lens include the new token. attn_logits is SGLang's
    split-KV scratch buffer; this implementation needs no scratch and leaves
    it untouched.
    """
    _check_supported(is_cross_attention, "decode_attention_cpu")
    if key is not None and value is not None:
        k_cache.index_copy_(0, loc.long(), key.to(k_cache.dtype))
        v_cache.index_copy_(0, loc.long(), value.to(v_cache.dtype))
    bsz, hq, d = query.shape
    if bsz == 0:
        return
    mod = kernel()
    if mod is not None and _kernel_takes(query, k_cache, v_cache, output, None, key_scale,
                                         value_scale, sinks):
        if bsz not in _decode_meta:  # one query per request, the last of its keys
            _decode_meta[bsz] = (torch.ones(bsz, dtype=torch.int64), torch.arange(bsz))
        ones, starts = _decode_meta[bsz]
        mod.paged_attention(query, output, k_cache, v_cache, None, None, req_to_token,
                            req_pool_indices, seq_lens, ones, starts, None, True, sm_scale,
                            logit_cap, window_plus_one)
        return
    if bsz == 1:
        # one request: its rows, no padding
        total = int(seq_lens[0])
        rows = req_to_token[int(req_pool_indices[0]), :total].long()
        mask = None
        if window_plus_one > 0:
            mask = (total - 1 - torch.arange(total, device=query.device) < window_plus_one).view(1, total)
        output.copy_(attend_rows(query, _read_cache(k_cache, rows, key_scale),
                                 _read_cache(v_cache, rows, value_scale), mask, sm_scale, logit_cap, sinks))
        return
    max_len = int(seq_lens.max())
    # rows: [B, Lmax] cache rows; positions past a request's length are masked.
    rows = req_to_token[req_pool_indices, :max_len].long()
    kpos = torch.arange(max_len, device=query.device).unsqueeze(0)      # [1, Lmax]
    lens = seq_lens.view(-1, 1)                                          # [B, 1]
    mask = kpos < lens
    if window_plus_one > 0:
        mask &= (lens - 1 - kpos) < window_plus_one
    rows = rows.masked_fill(~mask, 0)
    hkv = k_cache.shape[1]
    g = hq // hkv
    # one copy each into head-major layout, so both matmuls run without hidden copies
    k = _read_cache(k_cache, rows, key_scale).float().transpose(1, 2).contiguous()  # [B, Hkv, Lmax, D]
    v = _read_cache(v_cache, rows, value_scale).float().transpose(1, 2).contiguous()  # [B, Hkv, Lmax, Dv]
    qf = query.float().view(bsz, hkv, g, d)                                 # [B, Hkv, G, D]
    s = torch.matmul(qf, k.transpose(-1, -2)) * sm_scale                    # [B, Hkv, G, Lmax]
    p = _softmax(s.unsqueeze(3), logit_cap, sinks, mask.view(bsz, 1, 1, 1, max_len))
    out = torch.matmul(p.squeeze(3), v)                                     # [B, Hkv, G, Dv]
    output.copy_(out.reshape(bsz, hq, v.shape[-1]).to(output.dtype))
