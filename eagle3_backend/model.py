"""EAGLE-3 draft model in plain PyTorch: the reference the kernels, verifier and trainer use.

A Llama-style decoder layer whose attention reads ``[norm(embed), norm(h)]``
(2H wide), where ``h`` is the fc projection of K target hidden states (step 1)
or the draft's own previous hidden (later steps). Per token::

    h      = fc(fc_norm_k(chunk_k) ..)       # [T, K*Ht] -> [T, H]   (project)
    res    = hidden_norm(h) if norm_before_residual else h
    x      = attn(cat[input_layernorm(embed(ids)), hidden_norm(h)]) + res
    out    = mlp(post_attention_layernorm(x)) + x                  # pre-norm stream
    logits = lm_head(norm(out))                                    # [T, Vd] draft vocab
    next_hidden = norm(out) if norm_output else out                # fed to the next step

Drafts with ``num_hidden_layers`` > 1 (rare) run layers 1.. on the stream ``out`` as
plain pre-norm Llama layers, H wide, exactly as SGLang 0.5.23's ``llama_eagle3`` does:
``out = out + attn(hidden_norm(out)); out = out + mlp(post_attention_layernorm(out))``.
SGLang normalises their input with ``layers.N.hidden_norm`` (their
``input_layernorm`` exists there but is never used); speculators and vLLM name that
norm ``input_layernorm``, which the checkpoint readers and writers translate.

Parameter and buffer names are those of SGLang's EAGLE-3 checkpoints
(``fc``, ``input_norm`` for norm_before_fc, ``fc_norm.i``, ``midlayer.*``, ``norm``,
``lm_head``, ``embed_tokens``, ``d2t``, ``t2d``), so ``state_dict()`` is what
SGLang 0.5.23's ``LlamaForCausalLMEagle3.load_weights`` consumes. ``d2t[i]`` is
the offset from draft id ``i`` to its target id: ``target = i + d2t[i]``;
``t2d`` marks which target ids the draft vocabulary covers.

The KV cache (:class:`DraftKVCache`) holds one uniform length for the whole
batch (and every layer). Attention takes an optional boolean mask over ``cached + new`` keys so
that top-k trees can be drafted level by level (see :func:`tree_attention_mask`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eagle3_backend.config import DraftConfig, RopeScaling
from eagle3_backend.errors import Eagle3Error

__all__ = [
    "DraftKVCache",
    "Eagle3DraftModel",
    "propose_chain",
    "rope_inv_freq",
    "tree_attention_mask",
]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- cache
class DraftKVCache:
    """Preallocated K/V of the draft's attention layers; one length for the batch.

    ``k``, ``v``: [num_layers, B, Hkv, max_len, D]. A forward writes each layer's new
    keys through :meth:`layer`, then moves the shared length on with :meth:`advance`.
    ``crop(n)`` drops everything after the first ``n`` positions (after partial
    acceptance, or to discard a tree).
    """

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 num_layers: int = 1):
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def layer(self, i: int) -> "_LayerKV":
        """Layer ``i``'s view: ``append`` writes after the cached positions, not advancing."""
        return _LayerKV(self, i)

    def advance(self, n: int) -> None:
        """Count ``n`` more positions as cached (after every layer has appended them)."""
        self.length += n

    def crop(self, n: int) -> None:
        """Keep the first ``n`` cached positions."""
        if not 0 <= n <= self.length:
            raise Eagle3Error(f"cannot crop a draft KV cache of length {self.length} to {n}; "
                              f"expected 0 <= n <= {self.length}.")
        self.length = n

    def clone(self) -> "DraftKVCache":
        new = DraftKVCache.__new__(DraftKVCache)
        new.k, new.v, new.max_len, new.length = self.k.clone(), self.v.clone(), self.max_len, self.length
        return new


class _LayerKV:
    """One layer of a :class:`DraftKVCache` (what :class:`Attention` appends to)."""

    def __init__(self, cache: DraftKVCache, index: int):
        self.cache, self.index = cache, index

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, Hkv, T, D] after the cached ones; return all [B, Hkv, L+T, D]."""
        c = self.cache
        start, end = c.length, c.length + k.shape[2]
        if end > c.max_len:
            raise Eagle3Error(
                f"draft KV cache overflow: {start} cached + {k.shape[2]} new tokens exceed "
                f"max_len {c.max_len}. Allocate the cache with a larger max_len "
                "(prompt + generated + draft tokens)."
            )
        c.k[self.index, :, :, start:end] = k
        c.v[self.index, :, :, start:end] = v
        return c.k[self.index, :, :, :end], c.v[self.index, :, :, :end]


# ----------------------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back to the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim // 2], fp32, with optional linear, llama3 or yarn
    scaling.

    yarn also scales cos/sin by ``scaling.attention_scale`` (see :class:`Attention`).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu")
                             / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor    # longer than this: fully scaled
    high_wavelen = old_len / scaling.high_freq_factor  # shorter than this: kept
    wavelen = 2 * math.pi / inv_freq
    if scaling.high_freq_factor != scaling.low_freq_factor:
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor)
    else:
        smooth = torch.zeros_like(inv_freq)
    mid = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, mid)
    return torch.where(wavelen < high_wavelen, inv_freq, scaled)


def _yarn_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN (Peng et al. 2023, sec. 3.2) in fp32, as SGLang 0.5.23 and transformers compute it.

    Dimension pair i turns ``L / (2 pi) * theta^(-2i/D)`` times over the original
    context L; solving for i at ``beta_fast`` and ``beta_slow`` turns gives the ramp
    [lo, hi] (rounded outwards when ``truncate``, clamped to [0, D - 1]). Pairs below
    lo keep theta^(-2i/D), pairs above hi use it divided by ``factor``.
    """
    def dim_at(turns: float) -> float:
        return head_dim * math.log(scaling.original_max_position_embeddings
                                   / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_at(scaling.beta_fast), dim_at(scaling.beta_slow)
    if scaling.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    if hi == lo:
        hi += 0.001  # a step, not a division by zero
    # device="cpu": a model built under a meta-device context still gets real frequencies
    period = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu")
                       / head_dim)  # 1 / inv_freq
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - lo)
            / (hi - lo)).clamp(0, 1)
    keep = 1 - ramp  # 1: original frequency, 0: divided by factor
    return (1.0 / (scaling.factor * period)) * (1 - keep) + (1.0 / period) * keep


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of x [B, h, T, D] by cos/sin [B, 1, T, D/2] (fp32 math)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    """GQA self-attention with rotary positions over ``[embed, hidden]`` (2H wide input,
    the first layer) or the stream (H wide, ``first=False``)."""

    def __init__(self, cfg: DraftConfig, first: bool = True):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        width = (2 if first else 1) * cfg.hidden_size
        self.q_proj = nn.Linear(width, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)
        # A plain attribute, not a buffer: module.to(bfloat16) must not round it.
        self._inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        # yarn multiplies cos and sin by this (SGLang's cos_sin_cache does the same); else 1
        self._rope_scale = cfg.rope_scaling.attention_scale if cfg.rope_scaling else 1.0

    def rope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, T, D/2] (fp32) of positions [B, T], yarn's scale applied."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        angles = positions.float()[:, None, :, None] * self._inv_freq  # [B, 1, T, D/2]
        cos, sin = angles.cos(), angles.sin()
        if self._rope_scale != 1.0:
            cos, sin = cos * self._rope_scale, sin * self._rope_scale
        return cos, sin

    def rotate(self, q: torch.Tensor, k: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, Hq, T, D] and k [B, Hkv, T, D] rotated to their positions [B, T] (neox)."""
        cos, sin = self.rope_cos_sin(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Any,
                mask: torch.Tensor) -> torch.Tensor:
        # x: [B, T, 2H | H], positions: [B, T], mask: [B|1, T, L+T] bool (True = attend);
        # cache: anything with append(k, v) -> all k, v (a DraftKVCache layer), or None
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = self.rotate(q, k, positions)
        if cache is not None:
            k, v = cache.append(k, v)  # [B, Hkv, L+T, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))  # [B, T, H]


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The draft's first layer (checkpoint prefix ``midlayer.``)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: Any, mask: torch.Tensor) -> torch.Tensor:
        # embeds, hidden: [B, T, H] -> pre-norm output stream [B, T, H]
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        x = self.self_attn(x, positions, cache, mask) + residual
        return self.mlp(self.post_attention_layernorm(x)) + x


class UpperLayer(nn.Module):
    """A layer after the first (checkpoint prefix ``layers.N.``, N >= 1): a pre-norm Llama
    layer on the stream, its input normalised by ``hidden_norm`` as in SGLang 0.5.23."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, first=False)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Any,
                mask: torch.Tensor) -> torch.Tensor:
        # x: the stream [B, T, H] -> the stream [B, T, H]
        x = self.self_attn(self.hidden_norm(x), positions, cache, mask) + x
        return self.mlp(self.post_attention_layernorm(x)) + x


# ----------------------------------------------------------------------------- model
class Eagle3DraftModel(nn.Module):
    """EAGLE-3 draft; build with ``Eagle3DraftModel(cfg)`` (then load) or ``init_random``."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        cfg = self.config = config
        H, K, Ht = cfg.hidden_size, cfg.num_aux_hidden_states, cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(K * Ht, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(Ht, cfg.rms_norm_eps) for _ in range(K))
        self.fc = nn.Linear(K * Ht, H, bias=cfg.fc_bias)
        if cfg.has_embed_tokens:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.midlayer = DecoderLayer(cfg)
        if cfg.num_hidden_layers > 1:  # keys "1", "2", ..: state_dict names layers.N.*
            self.layers = nn.ModuleDict({str(n): UpperLayer(cfg)
                                         for n in range(1, cfg.num_hidden_layers)})
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.t2d[: cfg.draft_vocab_size] = True
        # Set by set_target_embedding; never saved (the target owns it).
        self.register_buffer("target_embedding", None, persistent=False)

    # ------------------------------------------------------------- construction
    @classmethod
    def init_random(cls, config: DraftConfig, seed: int = 0,
                    device: torch.device | str = "cpu") -> "Eagle3DraftModel":
        """Deterministic random weights in ``config.dtype`` (tests, demos).

        Linear weights ~ N(0, 1/fan_in), biases ~ N(0, 0.02^2), norm weights ~ 1 + N(0, 0.1^2),
        embedding ~ N(0, 1). With a draft vocabulary smaller than the target's, the
        covered target ids are a seeded random sorted subset.
        """
        gen = torch.Generator().manual_seed(seed)
        with torch.device("meta"):
            model = cls(config)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
                elif p.dim() == 1:  # RMSNorm weights
                    p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
                elif name == "embed_tokens.weight":
                    p.copy_(torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            if config.uses_vocab_map:
                ids = torch.randperm(config.vocab_size, generator=gen)[: config.draft_vocab_size]
                model.set_vocab_map(ids.sort().values)
            else:
                model.set_vocab_map(torch.arange(config.vocab_size))
        return model.to(device=device, dtype=config.torch_dtype)

    def set_vocab_map(self, target_ids: torch.Tensor) -> None:
        """Set d2t / t2d from the target id of each draft id (int [draft_vocab], unique)."""
        Vd, V = self.config.draft_vocab_size, self.config.vocab_size
        ids = torch.as_tensor(target_ids, dtype=torch.int64).flatten().cpu()
        if (ids.numel() != Vd or ids.min() < 0 or ids.max() >= V
                or ids.unique().numel() != Vd):  # Vd >= 1, so min/max exist when numel == Vd
            span = f" in [{ids.min().item()}, {ids.max().item()}]" if ids.numel() else ""
            raise Eagle3Error(
                f"draft vocabulary map must give {Vd} distinct target ids in [0, {V}), got "
                f"{ids.numel()} ids{span} with {ids.unique().numel()} distinct. "
                "Rebuild the map from the training vocabulary."
            )
        with torch.no_grad():
            self.d2t.copy_(ids - torch.arange(Vd))
            self.t2d.zero_()
            self.t2d[ids.to(self.t2d.device)] = True

    def set_target_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's embedding [vocab, H] (shared, not copied); like SGLang's
        ``set_embed`` it takes precedence over the draft's own ``embed_tokens`` and,
        with a tied lm_head, also serves as the lm_head."""
        want = (self.config.vocab_size, self.config.hidden_size)
        if tuple(weight.shape) != want:
            raise Eagle3Error(
                f"target embedding has shape {tuple(weight.shape)}, the draft expects {want} "
                "(target vocab_size x draft hidden_size). Pass the target's input embedding "
                "matrix (model.get_input_embeddings().weight) of the target the draft was trained on."
            )
        self.target_embedding = weight

    def new_cache(self, batch_size: int, max_len: int) -> DraftKVCache:
        """An empty KV cache (every layer) on this model's device and dtype."""
        return DraftKVCache(batch_size, self.config.num_key_value_heads, self.config.head_dim,
                            max_len, dtype=self.fc.weight.dtype, device=self.fc.weight.device,
                            num_layers=self.config.num_hidden_layers)

    def decoder(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                caches: Any, mask: torch.Tensor) -> torch.Tensor:
        """Every decoder layer: embeds, projected hidden [B, T, H] -> pre-norm stream [B, T, H].

        ``caches``: one per layer (``cache.layer(i)`` of a :class:`DraftKVCache`, or any
        object with ``append``), or None for no cache.
        """
        caches = caches if caches is not None else [None] * self.config.num_hidden_layers
        out = self.midlayer(embeds, hidden, positions, caches[0], mask)
        if self.config.num_hidden_layers > 1:
            for n, layer in self.layers.items():
                out = layer(out, positions, caches[int(n)], mask)
        return out

    # ------------------------------------------------------------------ pieces
    @property
    def embedding_weight(self) -> torch.Tensor:
        """[vocab, H]: the target's embedding once set, else the draft's own."""
        if self.target_embedding is not None:
            return self.target_embedding
        if self.config.has_embed_tokens:
            return self.embed_tokens.weight
        raise Eagle3Error(
            "this draft has no embed_tokens (has_embed_tokens=False) and no target embedding "
            "was given. Call model.set_target_embedding(target.get_input_embeddings().weight)."
        )

    @property
    def head_weight(self) -> torch.Tensor:
        """[draft_vocab, H]: lm_head weight, or the embedding when tied."""
        return self.embedding_weight if self.config.tie_word_embeddings else self.lm_head.weight

    def project(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """fc path: [..., K*Ht] target hidden states (layout order) -> [..., H]."""
        cfg = self.config
        if target_hidden.shape[-1] != cfg.fc_in_features:
            raise Eagle3Error(
                f"draft fc expects {cfg.num_aux_hidden_states} x {cfg.target_hidden_size} = "
                f"{cfg.fc_in_features} inputs (layout {cfg.layout}), got "
                f"{target_hidden.shape[-1]}. Capture exactly the draft's layout from the target."
            )
        x = target_hidden.to(self.fc.weight.dtype)
        if cfg.norm_before_fc:
            x = self.input_norm(x)
        if cfg.fc_norm:
            chunks = x.split(cfg.target_hidden_size, dim=-1)
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(x)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target-vocab ids: ``i + d2t[i]`` (any shape)."""
        return draft_ids + self.d2t[draft_ids]

    def _as_projected(self, hidden: torch.Tensor, projected: bool | None) -> torch.Tensor:
        H, W = self.config.hidden_size, self.config.fc_in_features
        if projected is None:
            if H == W and hidden.shape[-1] == H:
                raise Eagle3Error(
                    f"hidden width {H} equals both hidden_size and fc_in_features; pass "
                    "projected=True (draft hidden) or projected=False (target states) to forward."
                )
            projected = hidden.shape[-1] == H
        if projected:
            if hidden.shape[-1] != H:
                raise Eagle3Error(f"projected hidden must be {H} wide, got {hidden.shape[-1]}.")
            return hidden.to(self.fc.weight.dtype)
        return self.project(hidden)

    # ----------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                positions: torch.Tensor | None = None, cache: DraftKVCache | None = None,
                attn_mask: torch.Tensor | None = None, projected: bool | None = None,
                last_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft pass over T new tokens.

        input_ids [B, T] target-vocab ids; hidden [B, T, H] (projected) or [B, T, K*Ht]
        (target states, projected here); positions [B, T] (default: cache length + arange);
        cache: appended to in place; attn_mask [B|1, T, L+T] bool over the L cached and T
        new keys (True = attend; default causal). Returns logits [B, T, Vd] over the draft
        vocabulary (``last_logits``: [B, 1, Vd], the last token's only, as a drafting extend
        needs: the LM head then multiplies one row, not T) and next_hidden [B, T, H] for the
        next draft step.
        """
        B, T = input_ids.shape
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = (past + torch.arange(T, device=input_ids.device)).expand(B, T)
        if attn_mask is None:
            attn_mask = torch.ones(T, past + T, dtype=torch.bool, device=input_ids.device)
            attn_mask = attn_mask.tril(diagonal=past)[None]  # [1, T, L+T]
        elif attn_mask.dim() == 2:
            attn_mask = attn_mask[None]
        if attn_mask.shape[-2:] != (T, past + T) or attn_mask.dtype != torch.bool:
            raise Eagle3Error(
                f"attn_mask must be bool [B, {T}, {past + T}] ({past} cached + {T} new keys), "
                f"got {attn_mask.dtype} {list(attn_mask.shape)}."
            )
        h = self._as_projected(hidden, projected)                      # [B, T, H]
        embeds = F.embedding(input_ids, self.embedding_weight).to(h.dtype)
        layers = None if cache is None else [cache.layer(i)
                                              for i in range(self.config.num_hidden_layers)]
        out = self.decoder(embeds, h, positions, layers, attn_mask)   # [B, T, H]
        if cache is not None:
            cache.advance(T)
        normed = self.norm(out)
        head_in = normed[:, -1:] if last_logits else normed
        if self.config.tie_word_embeddings or self.lm_head.weight.dtype != normed.dtype:
            logits = F.linear(head_in, self.head_weight.to(normed.dtype))  # [B, T|1, Vd]
        else:                 # the layer itself: on CPU it may stream a bf16 copy (few_row_linears)
            logits = self.lm_head(head_in)
        return logits, (normed if self.config.norm_output else out)


# ----------------------------------------------------------------------------- drafting
def tree_attention_mask(parents: list[int], prefix_len: int,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """Mask [N, prefix_len + N] for N tree nodes after a cached prefix.

    ``parents[i]`` is the index of node i's parent among the nodes (< i), or -1 for a
    child of the last prefix token. Node i attends the whole prefix, its ancestors and
    itself. Rows of one level, cut to the columns cached so far, are the mask for
    drafting that level with :meth:`Eagle3DraftModel.forward`.
    """
    N = len(parents)
    mask = torch.zeros(N, prefix_len + N, dtype=torch.bool)
    mask[:, :prefix_len] = True
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise Eagle3Error(f"tree node {i} has parent {p}; expected -1 or an index < {i} "
                              "(nodes listed parents first).")
        mask[i, prefix_len + i] = True
        if p >= 0:
            mask[i, :] |= mask[p, :]
    return mask.to(device)


@torch.no_grad()
def propose_chain(model: Eagle3DraftModel, input_ids: torch.Tensor, hidden: torch.Tensor,
                  positions: torch.Tensor | None, cache: DraftKVCache | None, num_steps: int,
                  return_logits: bool = False):
    """Greedy chain drafting: ``num_steps`` target-vocab tokens [B, num_steps].

    Step 1 runs the T new tokens (input_ids [B, T], hidden [B, T, K*Ht] target states or
    [B, T, H]) and takes the argmax at the last position; each later step feeds back the
    drafted token with the draft's own last hidden at position + 1. The cache (one is
    made if None) keeps every step's K/V, so the caller crops it after verification.
    With ``return_logits`` also returns the draft-vocab logits [B, num_steps, Vd].
    """
    B, T = input_ids.shape
    if cache is None:
        cache = model.new_cache(B, T + num_steps)
    if positions is None:
        positions = (cache.length + torch.arange(T, device=input_ids.device)).expand(B, T)
    tokens, all_logits = [], []
    ids, h, pos, projected = input_ids, hidden, positions, None
    for _ in range(num_steps):
        logits, nxt = model(ids, h, pos, cache, projected=projected)
        last = logits[:, -1]                                     # [B, Vd]
        tok = model.draft_to_target(last.argmax(dim=-1))         # [B] target vocab
        tokens.append(tok)
        all_logits.append(last)
        ids, h, pos, projected = tok[:, None], nxt[:, -1:], pos[:, -1:] + 1, True
    out = torch.stack(tokens, dim=1)                             # [B, num_steps]
    return (out, torch.stack(all_logits, dim=1)) if return_logits else out
