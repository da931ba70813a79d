"""SGLang's RMSNorm, SiluAndMul and RotaryEmbedding layers on this package's C++ kernels.

Why: on the CPU engine without AMX these layers run their torch-native forwards, eight to
fifteen small ops each; at one token a step the ops cost their dispatch, not their
arithmetic (SmolLM2-135M: 61 norms, 30 rotary calls, 30 activations a step). SGLang's own
fused CPU kernels (``sgl_kernel.rmsnorm_cpu`` and the like) are used only behind a real
AMX probe. ``kernels/layer_ops.cpp`` does each layer in one call with the native forward's
semantics (see the .cpp; rows are computed alone, so a verify row equals the decode row).

How: the platform's ``post_load_model`` hook calls :func:`fuse_model`, which sets each
eligible layer's ``_forward_method``, the slot where SGLang's ``BaseFusedOp.forward``
keeps its resolved forward, to a function that calls the kernel and falls back to the
layer's ``forward_native`` for a call it does not take (another dtype, a post-residual
addition, a fused KV-buffer store). Layers whose forward is already pinned (SGLang pins
native for deterministic RL runs) and subclasses with other semantics are left alone.
``EAGLE3_CPU_LAYER_OPS=0`` turns it off; so does a failed build (``small_gemm.load``).

The offline verifier's draft (this package's own :class:`~eagle3_backend.model.Eagle3DraftModel`)
gets the same kernels through :func:`fuse_draft`: its RMSNorms and its attention's rotary,
eleven norms and two rotations a drafted tree, each one call instead of about eight ops.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

from eagle3_backend.cpu import small_gemm

logger = logging.getLogger(__name__)

ENV = "EAGLE3_CPU_LAYER_OPS"
_NORM_DTYPES = (torch.float32, torch.bfloat16)


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def rms_norm(layer, mod, x, residual=None, post_residual_addition=None, quant_linear=None):
    """``RMSNorm.forward_native`` in one kernel call (fp32 / bf16, no post-residual addition)."""
    if (post_residual_addition is not None or x.dtype not in _NORM_DTYPES
            or x.shape[-1] != layer.hidden_size
            or (residual is not None and (residual.dtype != x.dtype or residual.shape != x.shape))):
        return layer.forward_native(x, residual, post_residual_addition)
    outs = mod.rms_norm(x, layer.weight, layer.variance_epsilon, residual)
    return outs[0] if residual is None else (outs[0], outs[1])


def silu_and_mul(layer, mod, x):
    """``SiluAndMul.forward_native`` in one kernel call (fp32)."""
    if x.dtype != torch.float32 or x.shape[-1] % 2:
        return layer.forward_native(x)
    return mod.silu_and_mul(x)


def rotary(layer, mod, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    """``RotaryEmbedding.forward_native`` in one kernel call (fp32 query, key and cache)."""
    cache = layer.cos_sin_cache
    if (fused_set_kv_buffer_arg is not None or key is None or query.dtype != torch.float32
            or key.dtype != torch.float32 or cache.dtype != torch.float32
            or query.shape[0] != positions.numel() or positions.numel() == 0):
        return layer.forward_native(positions, query, key, offsets, fused_set_kv_buffer_arg)
    if offsets is not None:
        positions = positions + offsets
    return tuple(mod.rotary(positions, query, key, cache, layer.head_size, layer.rotary_dim,
                            layer.is_neox_style))


def _plain_norm(m) -> bool:
    return (m.has_weight and m.variance_size_override is None and not m.cast_x_before_out_mul
            and not m.fp32_residual and m.override_orig_dtype is None
            and m.weight.dim() == 1 and m.weight.dtype in _NORM_DTYPES and m.weight.is_contiguous()
            and m.weight.device.type == "cpu")


def _plain_rotary(m, base) -> bool:
    cls = type(m)
    return (all(getattr(cls, f) is getattr(base, f) for f in ("forward_native", "forward_cpu"))
            and not hasattr(m, "sin_cos_cache") and m.cos_sin_cache.dim() == 2
            and m.cos_sin_cache.shape[1] == m.rotary_dim and m.cos_sin_cache.is_contiguous()
            and m.cos_sin_cache.device.type == "cpu")


def fuse_model(model: torch.nn.Module, mod: Any | None = None) -> dict[str, int]:
    """Point the eligible RMSNorm / SiluAndMul / RotaryEmbedding layers of ``model`` at the
    kernels. Returns how many of each were fused (empty when off or not built)."""
    if not enabled():
        return {}
    mod = mod or small_gemm.load()
    if mod is None:
        return {}
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    rules = ((RMSNorm, _plain_norm, rms_norm),
             (SiluAndMul, lambda m: True, silu_and_mul),
             (RotaryEmbedding, lambda m: _plain_rotary(m, RotaryEmbedding), rotary))
    counts = {cls.__name__: 0 for cls, _, _ in rules}
    for m in model.modules():
        for cls, eligible, fn in rules:
            # exact classes (a subclass may change the semantics), any RotaryEmbedding that
            # keeps its forwards (Llama-3's changes only the frequencies); not a pinned forward
            ours = type(m) is cls or (cls is RotaryEmbedding and isinstance(m, cls))
            if ours and getattr(m, "_forward_method", 0) is None and eligible(m):
                m._forward_method = functools.partial(fn, m, mod)
                counts[cls.__name__] += 1
    logger.info("eagle3_backend.cpu: %s of %s run on the layer kernels",
                ", ".join(f"{n} {k}" for k, n in counts.items()), type(model).__name__)
    return counts


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def draft_norm(layer, mod, native, x, eps="eps"):
    """``eagle3_backend.model.RMSNorm.forward`` (or a transformers Llama-family RMSNorm's, its
    epsilon in attribute ``eps``) in one kernel call (fp32 / bf16 x, no autograd)."""
    w = layer.weight
    if (_needs_grad(x, w) or x.dtype not in _NORM_DTYPES or x.device.type != "cpu"
            or x.shape[-1] != w.shape[0] or x.numel() == 0):
        return native(x)
    return mod.rms_norm(x, w, getattr(layer, eps))[0]


def _draft_cos_sin(attn, positions: int) -> torch.Tensor:
    """[P >= positions, D] fp32 ``[cos | sin]`` from the draft attention's own
    ``rope_cos_sin`` (yarn's scale included), grown by doubling."""
    table = attn.__dict__.get("_eagle3_cos_sin")
    if table is None or table.shape[0] < positions:
        n = max(positions, 2 * (0 if table is None else table.shape[0]), 256)
        cos, sin = attn.rope_cos_sin(torch.arange(n)[None])           # [1, 1, n, D/2]
        table = attn.__dict__["_eagle3_cos_sin"] = torch.cat([cos[0, 0], sin[0, 0]], dim=-1)
    return table


def draft_rotary(attn, mod, native, q, k, positions):
    """``eagle3_backend.model.Attention.rotate`` in one kernel call (fp32, no autograd)."""
    B, Hq, T, D = q.shape
    if (_needs_grad(q, k) or q.dtype != torch.float32 or k.dtype != torch.float32
            or q.device.type != "cpu" or T == 0 or positions.shape != (B, T)):
        return native(q, k, positions)
    table = _draft_cos_sin(attn, int(positions.max()) + 1)
    qr, kr = mod.rotary(positions.reshape(-1), q.transpose(1, 2).reshape(B * T, -1),
                        k.transpose(1, 2).reshape(B * T, -1), table, D, D, True)
    return (qr.view(B, T, Hq, D).transpose(1, 2),
            kr.view(B, T, k.shape[1], D).transpose(1, 2))


def fuse_draft(model: torch.nn.Module, mod: Any | None = None) -> dict[str, int]:
    """Point the RMSNorms and attention rotations of an
    :class:`~eagle3_backend.model.Eagle3DraftModel` on the CPU at the kernels; a call that
    needs gradients (training) or another dtype keeps the torch ops. Returns how many of
    each were fused (empty when off or not built)."""
    if not enabled():
        return {}
    mod = mod or small_gemm.load()
    if mod is None:
        return {}
    from eagle3_backend.model import Attention, RMSNorm

    counts = {"RMSNorm": 0, "rotary": 0}
    for m in model.modules():
        if type(m) is RMSNorm and m.weight.device.type == "cpu" and m.weight.dtype in _NORM_DTYPES:
            m.forward = functools.partial(draft_norm, m, mod, m.forward)
            counts["RMSNorm"] += 1
        elif type(m) is Attention and m.q_proj.weight.device.type == "cpu":
            m.rotate = functools.partial(draft_rotary, m, mod, m.rotate)
            counts["rotary"] += 1
    return counts


# transformers RMSNorms whose forward is x * rsqrt(mean(x^2) + eps) in fp32, back in x's dtype,
# times the weight: the kernel's semantics (Gemma's 1 + weight, for one, is not)
_TRANSFORMERS_NORMS = (("llama", "LlamaRMSNorm"), ("mistral", "MistralRMSNorm"),
                       ("qwen2", "Qwen2RMSNorm"), ("qwen3", "Qwen3RMSNorm"))


def transformers_norm_classes() -> tuple[type, ...]:
    import importlib

    out = []
    for model, name in _TRANSFORMERS_NORMS:
        try:
            out.append(getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name))
        except (ImportError, AttributeError):
            continue
    return tuple(out)


def _target_norm(layer, mod, native, x):
    # transformers multiplies the weight in x's dtype: the kernel's rule when the two agree
    if x.dtype != layer.weight.dtype:
        return native(x)
    return draft_norm(layer, mod, native, x, eps="variance_epsilon")


def fuse_target(model: torch.nn.Module, mod: Any | None = None) -> int:
    """Point the RMSNorms of a transformers target on the CPU (the offline verifier's; the
    Llama-family classes in ``_TRANSFORMERS_NORMS``, exactly) at the kernel: two a layer, one
    call instead of about eight ops, and rows computed alone. A call that needs gradients or
    another dtype keeps the layer's forward. Returns how many were fused (0 when off)."""
    if not enabled():
        return 0
    mod = mod or small_gemm.load()
    if mod is None:
        return 0
    classes = transformers_norm_classes()
    count = 0
    for m in model.modules():
        if (type(m) in classes and isinstance(getattr(m, "weight", None), torch.Tensor)
                and m.weight.dim() == 1 and m.weight.device.type == "cpu"
                and isinstance(getattr(m, "variance_epsilon", None), float)):
            m.forward = functools.partial(_target_norm, m, mod, m.forward)
            count += 1
    return count
