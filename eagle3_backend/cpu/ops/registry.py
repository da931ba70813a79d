"""Register the CPU ops as ``torch.ops.sgl_kernel.*`` through ``torch.library``.

One table, ``OPS``: op name -> (schema, implementation). Schemas follow the
argument order of the call sites in SGLang 0.5.23 and annotate every tensor
the op writes (``Tensor(a!)``), so torch.compile and functionalization see
the mutations. ``copy_all_layer_kv_cache_cpu`` writes through raw addresses
held in ``data_ptrs``, which no schema can express; it is marked as mutating
nothing and must not be traced.

Ops SGLang's CPU graph runner already gives fake (meta) kernels
(``sglang.srt.model_executor.cpu_graph_runner.register_fake_ops``) get none
here, so the two registrations never collide; the others get one.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from eagle3_backend.cpu.ops import attention, cache_locs, kv_copy, spec_tree

logger = logging.getLogger(__name__)

NAMESPACE = "sgl_kernel"

OPS: dict[str, tuple[str, Callable]] = {
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
        "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
        "Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
        "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, "
        "Tensor? tree_mask, bool is_causal) -> ()",
        attention.extend_attention_cpu),
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, float value_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, "
        "float logit_cap, bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, "
        "Tensor? sinks) -> ()",
        attention.decode_attention_cpu),
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()",
        cache_locs.assign_req_to_token_pool_cpu),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()",
        cache_locs.assign_extend_cache_locs_cpu),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()",
        cache_locs.assign_draft_cache_locs_contiguous_cpu),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, "
        "int num_steps, int pool_len) -> Tensor",
        cache_locs.build_draft_decode_metadata_cpu),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
        "int accept_stride) -> ()",
        cache_locs.fill_bonus_tokens_cpu),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc) -> ()",
        cache_locs.fill_accept_out_cache_loc_cpu),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
        "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, "
        "Tensor(d!) retrive_next_token, Tensor(e!) retrive_next_sibling, int topk, int depth, "
        "int draft_token_num, int tree_mask_mode) -> ()",
        spec_tree.build_tree_kernel_efficient_cpu),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        spec_tree.verify_tree_greedy_cpu),
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        kv_copy.copy_all_layer_kv_cache_cpu),
}

# Fake kernels for ops SGLang's CPU graph runner does not cover itself.
_SGLANG_FAKES = {"extend_attention_cpu", "decode_attention_cpu"}

_library: torch.library.Library | None = None


def _fake_for(name: str) -> Callable:
    if name == "build_draft_decode_metadata_cpu":
        def fake(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
            return req_to_token.new_empty((req_pool_indices.shape[0] * topk, req_to_token.shape[1]))
        return fake

    def fake_none(*args, **kwargs):
        return None
    return fake_none


def registered() -> list[str]:
    """Names of the ops this package registered (empty before register_all)."""
    return sorted(OPS) if _library is not None else []


def register_all() -> None:
    """Define and implement every op in OPS under torch.ops.sgl_kernel (idempotent)."""
    global _library
    if _library is not None:
        return
    existing = [name for name in OPS if hasattr(getattr(torch.ops, NAMESPACE), name)]
    if existing:
        raise RuntimeError(
            f"torch.ops.{NAMESPACE} already defines {existing}; eagle3_backend.cpu only "
            "registers its ops when no sgl_kernel build serves the CPU. Unset "
            "SGLANG_USE_CPU_ENGINE or set EAGLE3_CPU_PLATFORM=0 to use the other build.")
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, (schema, impl) in OPS.items():
        lib.define(name + schema)
        lib.impl(name, impl, "CPU")
        if name not in _SGLANG_FAKES:
            torch.library.register_fake(f"{NAMESPACE}::{name}", _fake_for(name), lib=lib)
    _library = lib  # the registrations live as long as this object
    logger.info("registered %d CPU ops under torch.ops.%s", len(OPS), NAMESPACE)
