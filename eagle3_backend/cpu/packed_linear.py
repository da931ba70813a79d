"""Prepacked oneDNN weights for SGLang's unquantized linear layers and LM heads on CPU.

Why: ``F.linear`` on CPU runs a matrix-vector product for one token but a
GEMM for a few (a 4-token verify, a topk-wide draft step), and that GEMM
repacks the whole weight matrix on every call: measured on SmolLM2's
49152 x 576 LM head, 4 rows cost 2.5-3.5x one row. A weight packed once
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplied with
``torch.ops.mkldnn._linear_pointwise`` costs about the same for 4 rows as
F.linear for one, which is what makes a verify step cheap relative to a
decode step. Without the kernel below, one row keeps F.linear (see ``packed_linear``).

How: the platform's ``post_load_model`` hook (SGLang calls it once per
loaded model, target and draft) swaps the ``quant_method`` of every layer
that uses SGLang's ``UnquantizedLinearMethod`` / ``UnquantizedEmbeddingMethod``
for a subclass whose ``apply`` multiplies with the packed weight. The packed
copy is made on first use and remade whenever the layer's weight tensor is
replaced or modified in place (checked by identity and version counter on
every call), and dropped by ``process_weights_after_loading``: SGLang's loaders
write through ``param.data``, which the version counter does not see, and call
it after every load (``/update_weights_from_disk`` included). So weight reloads,
draft swaps (which bump the versions) and the EAGLE draft's shared embeddings
stay correct. Embedding lookups keep using the plain weight.

Up to 16 fp32 rows (a decode step, a verify, a top-k draft step) go first to the C++
kernel of ``small_gemm`` when it builds here: it streams each weight once for all rows
with prefetches far ahead: on this project's 2-core EPYC VM over SmolLM2-135M's linear
weights and LM head, one row costs 0.48x and 6 rows 0.57x one F.linear row, against 0.77x
for 6 rows through the packed weights (``benchmarks/bench_small_gemm.py``,
``benchmarks/results/small-gemm.json``).

A weight that bf16 holds exactly (a bf16 checkpoint served at ``--dtype float32``: an
EAGLE-3 draft usually) also gets a bf16 copy (half the fp32 weight's memory), made on
first use and checked once per weight version, and 1..16 fp32 rows, one row included,
multiply through the kernel from that copy: the same result as the fp32 kernel bit for
bit (the widening is exact), from half the bytes (``small_gemm.kernel_linear``; off with
``EAGLE3_CPU_BF16_WEIGHTS=0``).

Results equal ``F.linear`` up to fp32 summation order (a different GEMM
kernel), never worse than a different BLAS. Costs one packed copy of each
weight in memory. ``EAGLE3_CPU_PACKED_LINEAR=0`` turns it off.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

from eagle3_backend.cpu import small_gemm

logger = logging.getLogger(__name__)

ENV = "EAGLE3_CPU_PACKED_LINEAR"
_PACK_HINT_ROWS = 4  # oneDNN's layout hint; the packed weight serves any row count
_STATE = "_eagle3_packed_weight"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def supports(dtype: torch.dtype) -> bool:
    """True when this torch build can pack and multiply weights of ``dtype`` with oneDNN."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def _packed(layer: torch.nn.Module) -> torch.Tensor:
    return small_gemm.weight_derived(
        layer, _STATE, lambda w: torch.ops.mkldnn._reorder_linear_weight(w.detach(), _PACK_HINT_ROWS))


def packed_linear(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, layer.weight, bias)`` through a faster path: fp32 inputs of 1..16 rows
    go to the few-row kernel (:func:`small_gemm.kernel_linear`: each weight row read once
    for all rows, from its exact bf16 copy where there is one) when it is built, more rows
    to the layer's packed oneDNN weight.

    x: [..., K] -> [..., N]. Without the kernel one row stays on F.linear: its
    matrix-vector product streams the plain weight faster than oneDNN reads the packed one
    (whole-model sweep, SmolLM2-135M fp32: 93 ms vs 166 ms for one row; for
    4 rows 202 ms vs 176 ms, and 69 ms vs 28 ms on the LM head alone).
    Also falls back to F.linear for inputs the packed kernel does not take
    (other dtype, not on CPU, no rows).
    """
    w = layer.weight
    x2 = x.reshape(-1, x.shape[-1])                                    # [M, K]
    out = small_gemm.kernel_linear(layer, x, bias)
    if out is not None:
        return out
    if (x2.shape[0] < 2 or x.dtype != w.dtype or x.device.type != "cpu" or w.dim() != 2
            or (bias is not None and bias.dtype != w.dtype)):
        return F.linear(x, w, bias)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = torch.ops.mkldnn._linear_pointwise(x2, _packed(layer), bias, "none", [], "")
    return out.reshape(*x.shape[:-1], w.shape[0])


def _method_classes():
    from sglang.srt.layers.quantization.unquant import (
        UnquantizedEmbeddingMethod,
        UnquantizedLinearMethod,
    )

    class _Packed:
        def apply(self, layer, x, bias=None):
            return packed_linear(layer, x, bias)

        def process_weights_after_loading(self, layer):
            super().process_weights_after_loading(layer)
            for key in (_STATE, small_gemm.BF16_STATE):  # a load wrote through .data
                layer.__dict__.pop(key, None)

    class PackedCpuLinearMethod(_Packed, UnquantizedLinearMethod):
        """SGLang's unquantized linear, multiplied through a prepacked oneDNN weight."""

    class PackedCpuLMHeadMethod(_Packed, UnquantizedEmbeddingMethod):
        """SGLang's unquantized embedding/LM head: lookups unchanged, logits packed.

        Its class name is not in SGLang's list of unquantized LM-head methods, so
        the logits processor calls ``apply`` instead of its own matmul.
        """

    return UnquantizedLinearMethod, UnquantizedEmbeddingMethod, PackedCpuLinearMethod, PackedCpuLMHeadMethod


def pack_model(model: torch.nn.Module) -> int:
    """Swap the quant method of every unquantized CPU linear / vocab layer in ``model``.

    Returns how many layers now multiply through packed weights.
    """
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

    linear_cls, embed_cls, packed_linear_cls, packed_head_cls = _method_classes()
    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if method is None or not isinstance(weight, torch.Tensor) or weight.device.type != "cpu":
            continue
        if not supports(weight.dtype):
            continue
        if type(method) is linear_cls:
            module.quant_method = packed_linear_cls()
            count += 1
        elif type(method) is embed_cls and isinstance(module, VocabParallelEmbedding):
            module.quant_method = packed_head_cls()
            count += 1
    logger.info("eagle3_backend.cpu: %d linear layers of %s multiply through packed oneDNN weights",
                count, type(model).__name__)
    return count
