"""TargetInfo from HF config.json, model dirs and GGUF files (metadata only)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eagle3_backend.errors import TargetError
from eagle3_backend.target import TargetInfo


def _write_gguf(path, arch, **kv):
    """A metadata-only GGUF (plus an optional tiny token_embd of shape [vocab, hidden])."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    embd = kv.pop("token_embd", None)
    for key, value in kv.items():
        if isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    if embd is not None:
        w.add_tensor("token_embd.weight", np.zeros(embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------- GGUF
def test_bundled_gguf_exact_values(bundled_gguf):
    t = TargetInfo.from_path(bundled_gguf)
    assert (t.architecture, t.model_type) == ("LlamaForCausalLM", "llama")
    assert (t.num_hidden_layers, t.hidden_size, t.vocab_size) == (30, 576, 49152)
    assert (t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (9, 3, 64)
    assert t.intermediate_size == 1536
    assert t.rms_norm_eps == 1e-5  # float32 1e-5 read back as the decimal it was written as
    assert t.rope_theta == 100000.0
    assert t.max_position_embeddings == 8192
    assert t.source_format == "gguf"
    assert t.source == str(bundled_gguf.resolve())


def test_model_dir_with_one_gguf(tmp_path, bundled_gguf):
    (tmp_path / bundled_gguf.name).symlink_to(bundled_gguf)
    t = TargetInfo.from_path(tmp_path)
    assert (t.architecture, t.num_hidden_layers, t.hidden_size, t.vocab_size) == (
        "LlamaForCausalLM", 30, 576, 49152)


@pytest.mark.parametrize("arch, hf, model_type", [
    ("qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"),
    ("glm4moe", "Glm4MoeForCausalLM", "glm4_moe"),
    ("gpt-oss", "GptOssForCausalLM", "gpt_oss"),
    ("deepseek2", "DeepseekV2ForCausalLM", "deepseek_v2"),
])
def test_gguf_architecture_names(tmp_path, arch, hf, model_type):
    p = _write_gguf(tmp_path / "m.gguf", arch, **{f"{arch}.block_count": 4,
                                                   f"{arch}.embedding_length": 16,
                                                   f"{arch}.vocab_size": 100})
    t = TargetInfo.from_path(p)
    assert (t.architecture, t.model_type, t.num_hidden_layers, t.hidden_size, t.vocab_size) == (
        hf, model_type, 4, 16, 100)


def test_gguf_deepseek_v3_nextn_layers_and_vocab_from_embedding(tmp_path):
    # DeepSeek-V3 / Kimi-K2 GGUFs: arch deepseek2, sigmoid gating, block_count counts the MTP layer.
    p = _write_gguf(tmp_path / "dsv3.gguf", "deepseek2", **{
        "deepseek2.block_count": 62, "deepseek2.embedding_length": 16,
        "deepseek2.nextn_predict_layers": 1, "deepseek2.expert_gating_func": 2,
        "deepseek2.attention.head_count": 4, "token_embd": (10, 16)})
    t = TargetInfo.from_path(p)
    assert (t.architecture, t.model_type) == ("DeepseekV3ForCausalLM", "deepseek_v3")
    assert (t.num_hidden_layers, t.hidden_size, t.vocab_size, t.head_dim) == (61, 16, 10, 4)


def test_gguf_unknown_architecture(tmp_path):
    p = _write_gguf(tmp_path / "x.gguf", "rwkv7", **{"rwkv7.block_count": 4,
                                                      "rwkv7.embedding_length": 16})
    with pytest.raises(TargetError, match=r"GGUF architecture 'rwkv7' has no known HF "
                                          r"architecture .*Pass the model's HF config.json"):
        TargetInfo.from_path(p)


def test_gguf_missing_block_count(tmp_path):
    p = _write_gguf(tmp_path / "x.gguf", "llama", **{"llama.embedding_length": 16,
                                                      "llama.vocab_size": 10})
    with pytest.raises(TargetError, match=r"GGUF field 'llama.block_count' is None; expected a "
                                          r"positive integer"):
        TargetInfo.from_path(p)


def test_corrupt_gguf(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + b"\x00" * 7)
    with pytest.raises(TargetError, match=r"bad.gguf: not a readable GGUF file"):
        TargetInfo.from_path(p)


# --------------------------------------------------------------------------- HF config
def test_hf_config_and_model_dir(tiny_target_config):
    cfg = tiny_target_config(rope_theta=500000.0, rms_norm_eps=1e-5)
    for path in (cfg, cfg.parent):
        t = TargetInfo.from_path(path)
        assert (t.architecture, t.model_type, t.num_hidden_layers, t.hidden_size, t.vocab_size) == (
            "LlamaForCausalLM", "llama", 30, 64, 512)
        assert (t.rope_theta, t.rms_norm_eps, t.source_format) == (500000.0, 1e-5, "hf-config")
        assert t.source == str(cfg)


def test_hf_config_text_config_and_rope_parameters(tmp_path):
    raw = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
           "text_config": {"model_type": "qwen2_5_vl_text", "num_hidden_layers": 28,
                           "hidden_size": 3584, "vocab_size": 152064,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    t = TargetInfo.from_path(p)
    assert (t.architecture, t.model_type, t.num_hidden_layers, t.hidden_size, t.vocab_size,
            t.rope_theta) == ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl_text", 28, 3584,
                              152064, 1e6)


def test_mla_targets_give_a_draft_no_head_dim(tmp_path):
    """transformers saves a DeepSeek config's rope part (qk_rope_head_dim) as head_dim; a draft
    copying it had 4 x 16 = 64 wide attention on a 128 hidden size, and another width when the
    same model's original config (no head_dim) was given."""
    from eagle3_backend.checkpoint.demo import demo_config

    raw = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
           "num_hidden_layers": 8, "hidden_size": 128, "vocab_size": 512,
           "num_attention_heads": 4, "kv_lora_rank": 32, "qk_rope_head_dim": 16}
    for extra in ({}, {"head_dim": 16}):
        t = TargetInfo.from_hf_dict({**raw, **extra})
        assert t.head_dim is None
        assert demo_config(t).head_dim == 32  # hidden / heads
    dense = {k: v for k, v in raw.items() if k != "kv_lora_rank"}
    assert TargetInfo.from_hf_dict({**dense, "head_dim": 48}).head_dim == 48


@pytest.mark.parametrize("edit, match", [
    ({"num_hidden_layers": None}, r"field 'num_hidden_layers' is None; expected a positive integer"),
    ({"hidden_size": "576"}, r"field 'hidden_size' is '576'; expected a positive integer"),
    ({"vocab_size": 0}, r"field 'vocab_size' is 0; expected a positive integer"),
    ({"architectures": []}, r"field 'architectures' is \[\]; expected a non-empty list"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, r"is an EAGLE-3 draft, not a target"),
])
def test_hf_config_rejections(tiny_target_config, edit, match):
    with pytest.raises(TargetError, match=match):
        TargetInfo.from_path(tiny_target_config(**edit))


def test_malformed_json_names_file_and_position(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"architectures": ["LlamaForCausalLM"],\n "hidden_size": }')
    with pytest.raises(TargetError, match=r"config.json: is not valid JSON \(line 2, column 17"):
        TargetInfo.from_path(p)


def test_missing_path_and_empty_dir(tmp_path):
    with pytest.raises(TargetError, match=r"does not exist; expected a HF config.json, a model "
                                          r"directory or a .gguf file"):
        TargetInfo.from_path(tmp_path / "nope")
    with pytest.raises(TargetError, match=r"holds neither config.json nor a .gguf"):
        TargetInfo.from_path(tmp_path)


def test_frozen():
    t = TargetInfo("LlamaForCausalLM", "llama", 2, 8, 16, "x")
    with pytest.raises(AttributeError):
        t.hidden_size = 9  # type: ignore[misc]


def test_language_model_names_of_multimodal_checkpoints():
    from eagle3_backend.target import language_model_name

    assert language_model_name("language_model.model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight")                              # Kimi-K2.5, Llama 4
    assert language_model_name("language_model.lm_head.weight") == "lm_head.weight"
    assert language_model_name("model.language_model.embed_tokens.weight") == (
        "model.embed_tokens.weight")                                      # Gemma 3, Qwen3.5
    for other in ("model.visual.blocks.0.attn.qkv.weight", "vision_tower.patch_embed.proj.weight",
                  "model.embed_tokens.weight", "lm_head.weight"):
        assert language_model_name(other) is None
