"""Small random-weight targets of each architecture family users serve, for a 2-core CPU.

``write_target(family, out)`` writes a Hugging Face model dir (config.json +
safetensors + the bundled SmolLM2 tokenizer and chat template) built through
transformers' own config and model classes with seeded random weights. Each
keeps its family's real structure at a size a small CPU serves in seconds:

| family        | class                   | what is kept                                              |
|---------------|-------------------------|-----------------------------------------------------------|
| llama         | LlamaForCausalLM        | GQA                                                       |
| mistral       | MistralForCausalLM      | GQA (SGLang serves it with its Llama model file)          |
| qwen2         | Qwen2ForCausalLM        | GQA, biases on the q, k and v projections                 |
| qwen3         | Qwen3ForCausalLM        | GQA, per-head q/k RMSNorm                                 |
| qwen3_moe     | Qwen3MoeForCausalLM     | qk-norm, top-k routed experts (softmax, normalised)       |
| glm4_moe      | Glm4MoeForCausalLM      | qk-norm, partial rotary, sigmoid grouped routing with a   |
|               |                         | correction bias, shared experts, first dense layer        |
| glm4_moe_lite | Glm4MoeLiteForCausalLM  | GLM-4.7-Flash: DeepSeek's MLA with q LoRA, routing with a |
|               |                         | correction bias, shared experts, first dense layer        |
| deepseek_v3   | DeepseekV3ForCausalLM   | MLA with q LoRA, the rest as below                        |
| kimi_k2       | DeepseekV3ForCausalLM   | MLA without q LoRA (Kimi-K2's ``q_lora_rank`` is set;     |
|               |                         | this variant covers V2-Lite-style ``None``), ``noaux_tc`` |
|               |                         | grouped routing, shared experts, first_k_dense_replace,   |
|               |                         | yarn rope (factor 1: exact)                               |
| gpt_oss       | GptOssForCausalLM       | attention sinks, alternating sliding window, top-k        |
|               |                         | experts with biases; its model file alone captures the    |
|               |                         | last layer's output                                       |

``write_kimi_k25(kimi_k2_dir, out)`` wraps a written ``kimi_k2`` target as Kimi-K2.5
(``KimiK25ForConditionalGeneration``: a small vision tower around the same language model).

Heads, experts and intermediate sizes are even so that tensor parallel 2 splits
them. Real checkpoints are bf16/fp8; these are written in ``dtype`` (fp32 or
bf16: SGLang's fp8 layers need AMX on CPU).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB = 49152  # the bundled SmolLM2 tokenizer
HIDDEN = 128
LAYERS = 8  # the engine default layout (inputs of 2, L//2, L-3) needs at least 7
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
FFN = 256
_DONE = "eagle3_tiny_target.json"

_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, max_position_embeddings=4096, rms_norm_eps=1e-6,
               tie_word_embeddings=False)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# SGLang 0.5.23's DeepSeek attention builds its rope from a yarn scaling (the CPU path asserts
# deepseek_yarn); factor 1.0 makes yarn's ramp and mscale exactly plain rope.
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 1.0,
         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
         "mscale": 1.0, "mscale_all_dim": 1.0}
# Keys SGLang's DeepSeek model file reads from the config without a default.
_DEEPSEEK_SGLANG_KEYS = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
                         "num_nextn_predict_layers": 0}


def _llama(t: Any) -> Any:
    return t.LlamaConfig(**_COMMON, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         intermediate_size=FFN, rope_parameters=_ROPE)


def _qwen2(t: Any) -> Any:  # Qwen2 / Qwen2.5: biases on the q, k and v projections
    return t.Qwen2Config(**_COMMON, num_key_value_heads=KV_HEADS, intermediate_size=FFN,
                         rope_parameters=_ROPE)


def _mistral(t: Any) -> Any:
    return t.MistralConfig(**_COMMON, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                           intermediate_size=FFN, sliding_window=None, rope_parameters=_ROPE)


def _qwen3(t: Any) -> Any:
    return t.Qwen3Config(**_COMMON, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         intermediate_size=FFN, rope_parameters=_ROPE)


def _qwen3_moe(t: Any) -> Any:
    return t.Qwen3MoeConfig(**_COMMON, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                            intermediate_size=FFN, moe_intermediate_size=64, num_experts=8,
                            num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                            mlp_only_layers=[], rope_parameters=_ROPE)  # SGLang 0.5.23 makes every layer sparse


def _glm4_moe(t: Any) -> Any:
    return t.Glm4MoeConfig(**_COMMON, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                           intermediate_size=FFN, moe_intermediate_size=64, n_routed_experts=8,
                           n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                           first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=1.0,
                           use_qk_norm=True, attention_bias=True,
                           rope_parameters={**_ROPE, "partial_rotary_factor": 0.5})


def _deepseek(t: Any, q_lora_rank: int | None) -> Any:
    return t.DeepseekV3Config(**_COMMON, num_key_value_heads=HEADS, intermediate_size=FFN,
                              moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=1,
                              num_experts_per_tok=2, n_group=4, topk_group=2,
                              first_k_dense_replace=1, norm_topk_prob=True,
                              routed_scaling_factor=2.5, kv_lora_rank=64, q_lora_rank=q_lora_rank,
                              qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                              rope_parameters=_YARN, rope_interleave=True, num_mtp_layers=0)


def _glm4_moe_lite(t: Any) -> Any:  # GLM-4.7-Flash: MLA with q LoRA, one dense layer first
    return t.Glm4MoeLiteConfig(**_COMMON, num_key_value_heads=HEADS, intermediate_size=FFN,
                               moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=1,
                               num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True,
                               routed_scaling_factor=1.8, kv_lora_rank=64, q_lora_rank=48,
                               qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                               mlp_layer_types=["dense"] + ["sparse"] * (LAYERS - 1),
                               rope_parameters=_ROPE, rope_interleave=True)


def _gpt_oss(t: Any) -> Any:
    return t.GptOssConfig(**_COMMON, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                          intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                          sliding_window=16, layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2),
                          rope_parameters=_YARN)


#: family -> (config builder over the transformers module, extra config.json keys)
FAMILIES: dict[str, tuple[Callable[[Any], Any], dict[str, Any]]] = {
    "llama": (_llama, {}),
    "qwen2": (_qwen2, {}),
    "mistral": (_mistral, {}),
    "qwen3": (_qwen3, {}),
    "qwen3_moe": (_qwen3_moe, {}),
    "glm4_moe": (_glm4_moe, {}),
    "deepseek_v3": (lambda t: _deepseek(t, q_lora_rank=48), _DEEPSEEK_SGLANG_KEYS),
    "kimi_k2": (lambda t: _deepseek(t, q_lora_rank=None), _DEEPSEEK_SGLANG_KEYS),
    "glm4_moe_lite": (_glm4_moe_lite, {**_DEEPSEEK_SGLANG_KEYS, "first_k_dense_replace": 1}),
    "gpt_oss": (_gpt_oss, {}),
}


def write_target(family: str, out: str | Path, seed: int = 0, dtype: str = "float32",
                 echo: float = 0.0, hidden_size: int | None = None, layers: int | None = None,
                 tied: bool = False) -> Path:
    """Write the small ``family`` target to ``out`` (reused when already written the same way).

    ``echo`` > 0 adds ``echo`` x the token embedding to the lm_head, so that greedy output
    repeats its current token in runs (at 0.35 about 85-90% of tokens on every family, with
    switches between runs): a target on which a draft that proposes "the same token again"
    is accepted, and sometimes rejected. ``hidden_size`` replaces the family's 128 (attention
    and expert shapes are set on their own and stay), ``layers`` its 8 (not for gpt_oss, whose
    layer types are listed); ``tied`` makes the lm_head the input embedding.
    """
    import torch
    import transformers
    from transformers import AutoTokenizer

    from eagle3_backend.errors import TargetError
    from eagle3_backend.target import bundled_target_path

    if family not in FAMILIES:
        raise TargetError(f"unknown small-target family {family!r}; expected one of "
                          f"{', '.join(FAMILIES)}.")
    out = Path(out)
    stamp = {"family": family, "seed": seed, "dtype": dtype, "echo": echo,
             "hidden_size": hidden_size, "layers": layers, "tied": tied}
    marker = out / _DONE
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out
    build, extra = FAMILIES[family]
    config = build(transformers)
    if hidden_size is not None:
        config.hidden_size = hidden_size
    if layers is not None:
        config.num_hidden_layers = layers
    config.tie_word_embeddings = tied
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    _randomize_router_biases(model, seed)
    if echo:
        with torch.no_grad():
            model.lm_head.weight.add_(echo * model.get_input_embeddings().weight)
    model.eval().save_pretrained(out)
    if extra:
        path = out / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}, indent=2))
    gguf = bundled_target_path()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    marker.write_text(json.dumps(stamp))
    return out


def _randomize_router_biases(model: Any, seed: int) -> None:
    """transformers initializes ``e_score_correction_bias`` to zeros; a zero bias would leave
    the grouped routing's bias path untested, so give it seeded values of the router's scale."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn(buf.shape, generator=g) * 0.1)


# Kimi-K2.5 ships its processor as remote code; SGLang 0.5.23 loads it at start even with
# --skip-tokenizer-init and reads tokenizer, image_processor and media_processor.media_proc_cfg.
# This text-only stand-in has exactly those (served with --trust-remote-code, like the real one).
_K25_PROCESSOR = '''"""Text-only stand-in for Kimi-K2.5's remote-code processor (eagle3_backend tiny targets)."""
from transformers import AutoTokenizer


class _Media:
    media_proc_cfg = {"patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 16384,
                      "patch_limit_on_one_side": 512, "image_mean": [0.5, 0.5, 0.5],
                      "image_std": [0.5, 0.5, 0.5]}


class KimiK25Processor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.media_processor = self.image_processor = _Media()

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        return cls(AutoTokenizer.from_pretrained(path))

    @classmethod
    def register_for_auto_class(cls, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("a text-only stand-in: it does not process images")
'''


def write_kimi_k25(language_model: str | Path, out: str | Path, seed: int = 0) -> Path:
    """A Kimi-K2.5 (``KimiK25ForConditionalGeneration``) dir around a written ``kimi_k2``
    target: its tensors under ``language_model.``, its config as ``text_config``, and a
    one-block MoonViT tower and patch-merger projector (seeded, hidden 32) under the real
    checkpoint's tensor names. Text served by it is the language model's, token for token.
    Serve it with ``--trust-remote-code`` (the processor is remote code, as in the real one).
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, out = Path(language_model), Path(out)
    text = {k: v for k, v in json.loads((src / "config.json").read_text()).items()
            if k != "transformers_version"}
    h, vt, ffn, patch = text["hidden_size"], 32, 64, 14
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=g) * 0.02

    sd = {f"language_model.{k}": v for f in sorted(src.glob("*.safetensors"))
          for k, v in load_file(str(f)).items()}
    tower, block = "vision_tower.", "vision_tower.encoder.blocks.0."
    sd.update({tower + "patch_embed.proj.weight": rnd(vt, 3, patch, patch),
               tower + "patch_embed.proj.bias": rnd(vt),
               tower + "patch_embed.pos_emb.weight": rnd(8, 8, vt),
               block + "wqkv.weight": rnd(3 * vt, vt), block + "wqkv.bias": rnd(3 * vt),
               block + "wo.weight": rnd(vt, vt), block + "wo.bias": rnd(vt),
               block + "mlp.fc0.weight": rnd(ffn, vt), block + "mlp.fc0.bias": rnd(ffn),
               block + "mlp.fc1.weight": rnd(vt, ffn), block + "mlp.fc1.bias": rnd(vt),
               "mm_projector.proj.0.weight": rnd(4 * vt, 4 * vt), "mm_projector.proj.0.bias": rnd(4 * vt),
               "mm_projector.proj.2.weight": rnd(h, 4 * vt), "mm_projector.proj.2.bias": rnd(h)})
    for norm, size in ((block + "norm0", vt), (block + "norm1", vt),
                       (tower + "encoder.final_layernorm", vt), ("mm_projector.pre_norm", vt)):
        sd[norm + ".weight"], sd[norm + ".bias"] = torch.ones(size), torch.zeros(size)
    # the real config names the tower's shape vt_*; SGLang's vision config reads the plain
    # names for the tower and vt_hidden_size for the projector: both are given
    shape = dict(hidden_size=vt, num_attention_heads=2, num_hidden_layers=1, intermediate_size=ffn)
    vision = dict(patch_size=patch, init_pos_emb_height=8, init_pos_emb_width=8,
                  init_pos_emb_time=4, pos_emb_type="divided_fixed", merge_kernel_size=[2, 2],
                  video_attn_type="spatial_temporal", merge_type="sd2_tpool",
                  mm_projector_type="patchmerger", mm_hidden_size=vt, projector_hidden_act="gelu",
                  projector_ln_eps=1e-5, text_hidden_size=h, **shape,
                  **{f"vt_{k}": v for k, v in shape.items()})
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              # as in the real checkpoint: SGLang reads text_config's architectures[0]
              "text_config": {**text, "model_type": "kimi_k2"}, "vision_config": vision,
              "media_placeholder_token_id": text["vocab_size"] - 1, "pad_token_id": 0,
              "ignore_index": -100, "use_unified_vision_chunk": False,
              "tie_word_embeddings": text.get("tie_word_embeddings", False),
              "dtype": text.get("dtype", "float32"),
              "auto_map": {"AutoProcessor": "kimi_k25_processor.KimiK25Processor"}}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "kimi_k25_processor.py").write_text(_K25_PROCESSOR)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(f, out / f.name)
    return out
