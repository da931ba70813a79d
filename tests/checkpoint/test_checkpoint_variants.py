"""Published EAGLE-3 draft variants, each mimicked by a tiny checkpoint with the same
config.json fields and tensor names as the real one (dims shrunk to the tiny draft's).

Sources of the config shapes (read, not copied): SpecForge ``configs/*.json`` (Llama-3.1,
Kimi-K2, gpt-oss, Llama-4), AngelSlim ``configs/qwen3-8b-eagle3.json`` (vLLM's
``Eagle3LlamaForCausalLM``), the EAGLE repo ``eagle/traineagle3/config.json`` and its
``pytorch_model.bin`` drafts, ModelOpt's ``export_spec_ckpt_config`` (nvidia/*-Eagle3:
extra eagle_config keys, no t2d) and SGLang 0.5.23's ``llama_eagle3.py`` /
``set_eagle3_layers_to_capture`` of each target model file.
"""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_backend.checkpoint import load_draft, save_sglang
from eagle3_backend.cli import main
from eagle3_backend.errors import CheckpointError
from eagle3_backend.layout import Layout
from eagle3_backend.target import TargetInfo

QWEN3_8B = TargetInfo("Qwen3ForCausalLM", "qwen3", 36, 64, 512, "tiny-qwen3-8b")

# Real published configs with the tiny dims (hidden 64, 4 heads, 2 kv heads, vocab 512,
# draft vocab 128); every other key as published.
ANGELSLIM_QWEN3_8B = {
    "architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 40960,
    "max_window_layers": 36, "num_attention_heads": 4, "num_hidden_layers": 1,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 512, "draft_vocab_size": 128,
}
SPECFORGE_GPT_OSS = {
    "architectures": ["GptOssForCausalLMEagle3"],
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]},
    "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 128, "num_local_experts": 16, "max_position_embeddings": 4096,
    "model_type": "gpt_oss", "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.52.3", "use_cache": True,
    "vocab_size": 512, "experts_per_token": 4, "draft_vocab_size": 128,
}


def _publish(tmp_path: Path, name: str, config: dict, tensors: dict) -> Path:
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


@pytest.fixture
def weights(tiny_draft):
    """The tiny draft's tensors under SGLang's names, bf16, no embed_tokens (SpecForge-like)."""
    torch.manual_seed(0)
    return dict(tiny_draft(dtype="bfloat16", embed=False).state_dict)


# --------------------------------------------------------------- vLLM / AngelSlim class name
def test_angelslim_eagle3llama_draft_is_read_and_converted(tmp_path, weights):
    src = _publish(tmp_path, "angelslim", ANGELSLIM_QWEN3_8B, weights)
    d = load_draft(src, target=QWEN3_8B)
    assert (d.format, d.layout_source, d.dtype) == ("vllm", "assumed-default", "bfloat16")
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:18", "layer_input:33"]
    assert d.warnings[-1] == (
        "no layer ids recorded: assumed the vLLM/SGLang default for a 36-layer target, inputs "
        "of layers 2, L//2, L-3 = [layer_input:2, layer_input:18, layer_input:33]; right only "
        "if the draft was trained with the default")

    out = save_sglang(d, tmp_path / "sg")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 17, 32]
    written = load_file(str(out / "model.safetensors"))
    assert sorted(written) == sorted(weights)
    for k, v in weights.items():
        assert torch.equal(written[k], v), k


def test_eagle3llama_top_level_ids_are_vllm_ids(tmp_path, weights):
    # vLLM reads a top-level eagle_aux_hidden_state_layer_ids, id k = input of layer k.
    cfg = dict(ANGELSLIM_QWEN3_8B, eagle_aux_hidden_state_layer_ids=[2, 18, 33])
    d = load_draft(_publish(tmp_path, "vllm-ids", cfg, weights))
    assert (d.format, d.layout_source) == ("vllm", "engine-ids")
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:18", "layer_input:33"]
    assert d.layout_explanation == ("top-level ids [2, 18, 33] read as vLLM ids (input of layer "
                                    "k) = [layer_input:2, layer_input:18, layer_input:33]")


def test_eagle3llama_nested_ids_are_sglang_ids_with_a_warning(tmp_path, weights):
    cfg = dict(ANGELSLIM_QWEN3_8B, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 17, 32]})
    d = load_draft(_publish(tmp_path, "nested", cfg, weights), target=QWEN3_8B)
    assert (d.format, d.layout_source) == ("vllm", "engine-ids")
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:18", "layer_input:33"]
    assert d.warnings[-1] == (
        "architectures Eagle3LlamaForCausalLM (vLLM's name) with only nested eagle_config ids "
        "[1, 17, 32]: read as SGLang ids; vLLM reads only a top-level "
        "eagle_aux_hidden_state_layer_ids and would capture its default layers")


def test_validate_says_stock_sglang_needs_a_conversion(tmp_path, weights, tiny_target_config,
                                                        capsys):
    src = _publish(tmp_path, "angelslim", ANGELSLIM_QWEN3_8B, weights)
    target = tiny_target_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                                num_hidden_layers=36)
    assert main(["validate", str(src), "--target", str(target)]) == 1  # as the plugin refuses it
    out = capsys.readouterr().out
    assert (f"declares architectures ['Eagle3LlamaForCausalLM']; expected "
            f"['LlamaForCausalLMEagle3']") in out
    assert f"Convert the draft with `eagle3 convert {src} OUT --to sglang --target <target>`" in out


def test_unknown_eagle_draft_class_is_refused_by_name(tmp_path, weights):
    # SpecForge's gpt-oss draft config names a class neither SGLang 0.5.23 nor vLLM has;
    # it used to pass as an SGLang draft because it has an eagle_config.
    src = _publish(tmp_path, "gptoss", SPECFORGE_GPT_OSS, weights)
    with pytest.raises(CheckpointError) as err:
        load_draft(src)
    assert str(err.value) == (
        f"{src}/config.json: architectures ['GptOssForCausalLMEagle3'] name a draft model class "
        f"this backend does not implement (neither SGLang 0.5.23 nor vLLM has "
        f"'GptOssForCausalLMEagle3'); expected ['LlamaForCausalLMEagle3', "
        f"'Eagle3LlamaForCausalLM', 'EAGLE3LlamaForCausalLM'] (a Llama-style EAGLE-3 draft "
        f"layer) or ['Eagle3Speculator']. Re-export the draft as a Llama EAGLE-3 draft, or serve "
        f"it with the engine it was trained for.")


# ------------------------------------------------------------------ use_aux_hidden_state
def test_use_aux_hidden_state_false_is_refused(make_draft_checkpoint, tiny_target_config,
                                               capsys):
    # SGLang reads eagle_config.use_aux_hidden_state: false means no capture and no fc, so an
    # EAGLE-3 draft runs on the last hidden state alone (acceptance ~1.0, no error).
    src = make_draft_checkpoint("specforge", config_hook=lambda c: c["eagle_config"].update(
        use_aux_hidden_state=False))
    want = (f"{src}/config.json: eagle_config.use_aux_hidden_state is false, but the draft's fc "
            f"reads 3 target hidden states [layer_input:2, layer_input:15, layer_input:27]; "
            f"expected true. With false, SGLang captures no hidden states, skips the fc and feeds "
            f"the draft the target's last hidden state (acceptance length ~1.0, no error). Set "
            f"\"use_aux_hidden_state\": true in eagle_config.")
    with pytest.raises(CheckpointError) as err:
        load_draft(src)
    assert str(err.value) == want
    assert main(["validate", str(src), "--target", str(tiny_target_config())]) == 1
    assert f"  - {want}\n" in capsys.readouterr().out
    ok = make_draft_checkpoint("specforge", config_hook=lambda c: c["eagle_config"].update(
        use_aux_hidden_state=True))
    assert load_draft(ok).problems == ()


# ------------------------------------------------ SGLang id rules of more target model files
# (target architecture, L, eagle_config ids) -> inputs of layers SGLang 0.5.23 captures.
MORE_TARGETS = [
    ("Llama4ForConditionalGeneration", 48, [1, 23, 44], [2, 24, 45]),  # Llama-4 Scout/Maverick
    ("Llama4ForCausalLM", 48, [-1, 10, 20], [0, 11, 21]),
    ("KimiK25ForConditionalGeneration", 61, [2, 30, 58], [2, 30, 58]),  # deepseek_v2 rule
    ("KimiK25ForConditionalGeneration", 61, [1, 29, 57], [2, 30, 58]),
    ("Qwen3VLForConditionalGeneration", 36, [1, 17, 32], [2, 18, 33]),
    ("Qwen3VLMoeForConditionalGeneration", 48, [1, 23, 44], [2, 24, 45]),
    ("Qwen2_5_VLForConditionalGeneration", 28, [1, 13, 24], [2, 14, 25]),
    ("BailingMoeV2ForCausalLM", 32, [1, 15, 28], [2, 16, 29]),  # Ling-flash-2.0
    ("MiniMaxM2ForCausalLM", 62, [1, 30, 58], [2, 31, 59]),
    ("Glm4MoeLiteForCausalLM", 47, [2, 23, 44], [2, 23, 44]),  # deepseek_v2 rule
    # SpecForge ships draft configs for these; the plugin does not serve them (plan.ARCHS)
    ("Qwen2MoeForCausalLM", 24, [1, 11, 20], [2, 12, 21]),
    ("Qwen3NextForCausalLM", 48, [1, 23, 44], [2, 24, 45]),
    ("Qwen3_5ForConditionalGeneration", 64, [1, 31, 60], [2, 32, 61]),
    ("Qwen3_5MoeForConditionalGeneration", 60, [-1, 29, 56], [0, 30, 57]),
    ("Qwen3_5ForCausalLM", 64, [1, 31, 60], [2, 32, 61]),
    ("Qwen3_5MoeForCausalLM", 40, [1, 19, 36], [2, 20, 37]),
    ("ApertusForCausalLM", 32, [1, 15, 28], [2, 16, 29]),
    ("Glm5NextForConditionalGeneration", 78, [1, 38, 74], [2, 39, 75]),
]


@pytest.mark.parametrize("arch, L, ids, caps", MORE_TARGETS)
def test_sglang_ids_on_more_targets(arch, L, ids, caps):
    assert list(Layout.from_sglang_ids(ids, arch, L).layers) == caps
    written = Layout.of_layers(caps).to_sglang_ids(arch, L)  # what convert writes
    assert list(Layout.from_sglang_ids(written, arch, L).layers) == caps


def test_specforge_llama4_draft_converts_for_a_llama4_target(make_draft_checkpoint, tmp_path):
    # Used to fail: "no SGLang layer-id rule known for target architecture
    # 'Llama4ForConditionalGeneration'".
    src = make_draft_checkpoint("specforge", ids=None)  # SpecForge's llama4 config has no ids
    target = TargetInfo("Llama4ForConditionalGeneration", "llama4", 48, 64, 512, "tiny-llama4")
    d = load_draft(src, target=target)
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:24", "layer_input:45"]
    cfg = json.loads((save_sglang(d, tmp_path / "sg", target=target) / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 23, 44]


def test_a_target_without_a_known_id_rule_names_a_fix_that_works(make_draft_checkpoint):
    """Gemma 3's SGLang file also captures the last layer's output and keeps the residual apart:
    no rule is claimed for it. The refusal's advice, --ids-as specforge, reads the ids."""
    src = make_draft_checkpoint("specforge", ids=[1, 23, 44])
    target = TargetInfo("Gemma3ForCausalLM", "gemma3_text", 48, 64, 512, "tiny-gemma3")
    with pytest.raises(CheckpointError) as err:
        load_draft(src, target=target)
    assert "'Gemma3ForCausalLM'" in str(err.value) and "pass --ids-as specforge" in str(err.value)
    assert load_draft(src, target=target, ids_as="specforge").layout.layers == (2, 24, 45)


_MODEL_FILES = {  # arch -> (SGLang class, the language model class it delegates to, or None)
    "Llama4ForConditionalGeneration": ("sglang.srt.models.mllama4.Llama4ForConditionalGeneration",
                                       "sglang.srt.models.llama4.Llama4ForCausalLM"),
    "Llama4ForCausalLM": ("sglang.srt.models.llama4.Llama4ForCausalLM", None),
    "KimiK25ForConditionalGeneration": ("sglang.srt.models.kimi_k25.KimiK25ForConditionalGeneration",
                                        "sglang.srt.models.deepseek_v2.DeepseekV3ForCausalLM"),
    "Qwen3VLForConditionalGeneration": ("sglang.srt.models.qwen3_vl.Qwen3VLForConditionalGeneration",
                                        None),
    "Qwen3VLMoeForConditionalGeneration": (
        "sglang.srt.models.qwen3_vl_moe.Qwen3VLMoeForConditionalGeneration", None),
    "Qwen2_5_VLForConditionalGeneration": (
        "sglang.srt.models.qwen2_5_vl.Qwen2_5_VLForConditionalGeneration", None),
    "BailingMoeV2ForCausalLM": ("sglang.srt.models.bailing_moe.BailingMoeV2ForCausalLM", None),
    "Glm4MoeLiteForCausalLM": ("sglang.srt.models.glm4_moe_lite.Glm4MoeLiteForCausalLM", None),
    "Qwen2MoeForCausalLM": ("sglang.srt.models.qwen2_moe.Qwen2MoeForCausalLM", None),
    "Qwen3NextForCausalLM": ("sglang.srt.models.qwen3_next.Qwen3NextForCausalLM", None),
    "Qwen3_5ForConditionalGeneration": ("sglang.srt.models.qwen3_5.Qwen3_5ForConditionalGeneration",
                                        None),
    "Qwen3_5MoeForConditionalGeneration": (
        "sglang.srt.models.qwen3_5.Qwen3_5MoeForConditionalGeneration", None),
    "Qwen3_5ForCausalLM": ("sglang.srt.models.qwen3_5_text.Qwen3_5ForCausalLM", None),
    "Qwen3_5MoeForCausalLM": ("sglang.srt.models.qwen3_5_text.Qwen3_5MoeForCausalLM", None),
    "ApertusForCausalLM": ("sglang.srt.models.apertus.ApertusForCausalLM", None),
    "Glm5NextForConditionalGeneration": (
        "sglang.srt.models.glm5_next.Glm5NextForConditionalGeneration", None),
    # MiniMaxM2ForCausalLM needs SGLang's parallel state to be built; read, not run.
}


@pytest.mark.sglang
@pytest.mark.parametrize("arch, L, ids, caps", [c for c in MORE_TARGETS if c[0] in _MODEL_FILES])
def test_more_targets_match_the_installed_model_files(arch, L, ids, caps):
    pytest.importorskip("sglang")
    outer_path, inner_path = _MODEL_FILES[arch]
    outer = pkgutil.resolve_name(outer_path)

    def stand_in(cls):  # what set_eagle3_layers_to_capture touches, nothing more
        model = SimpleNamespace(layers_to_capture=[], layers=[SimpleNamespace() for _ in range(L)])
        model.set_eagle3_layers_to_capture = lambda c: setattr(model, "layers_to_capture", c)
        obj = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), model=model,
                              config=SimpleNamespace(num_hidden_layers=L),
                              capture_aux_hidden_states=False, language_model=None)
        if cls is not None:
            obj.set_eagle3_layers_to_capture = lambda i: cls.set_eagle3_layers_to_capture(obj, i)
        return obj, model

    fake, model = stand_in(None)
    if inner_path is not None:
        fake.language_model, model = stand_in(pkgutil.resolve_name(inner_path))
    outer.set_eagle3_layers_to_capture(fake, ids)
    assert sorted(model.layers_to_capture) == caps


# ------------------------------------------------------------ speculators Qwen3 draft layer
def test_speculators_qwen3_draft_layer_is_refused_not_stripped(make_draft_checkpoint):
    # speculators builds a Qwen3DecoderLayer (q_norm/k_norm) when transformer_layer_config
    # says model_type qwen3; the message used to suggest removing the "unknown" tensors.
    def qwen3_layer(c):
        c["transformer_layer_config"].update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])

    def qk_norms(t):
        t["layers.0.self_attn.q_norm.weight"] = torch.ones(16)
        t["layers.0.self_attn.k_norm.weight"] = torch.ones(16)

    src = make_draft_checkpoint("speculators", config_hook=qwen3_layer, tensors_hook=qk_norms)
    with pytest.raises(CheckpointError) as err:
        load_draft(src)
    assert str(err.value) == (
        f"{src}/model.safetensors: tensors ['layers.0.self_attn.k_norm.weight', "
        f"'layers.0.self_attn.q_norm.weight'] are per-head q/k norms of a Qwen3-style draft "
        f"layer (model_type 'qwen3'); expected a Llama draft layer, the only kind this backend "
        f"implements. SGLang 0.5.23's LlamaForCausalLMEagle3 would drop them without a word and "
        f"serve a different model, so do not strip them: serve this draft with "
        f"vLLM/speculators.")


# ------------------------------------------------------- full-vocabulary draft, no lm_head
def test_full_vocab_draft_without_lm_head_says_where_the_head_lives(make_draft_checkpoint):
    # draft_vocab_size null + no lm_head.weight: SGLang takes the target's lm_head.
    src = make_draft_checkpoint(
        "specforge", draft_vocab_size=512,
        config_hook=lambda c: c.update(draft_vocab_size=None),
        tensors_hook=lambda t: {k: v for k, v in t.items()
                                if k not in ("lm_head.weight", "d2t", "t2d")})
    with pytest.raises(CheckpointError) as err:
        load_draft(src)
    assert str(err.value) == (
        f"{src}/model.safetensors: missing tensor 'lm_head.weight' of a full-vocabulary draft "
        f"(draft_vocab_size 512 = vocab_size); expected it in the checkpoint. Such a draft shares "
        f"the target's lm_head (SGLang loads it from the target when draft_vocab_size is null), "
        f"which this backend does not do: copy the target's lm_head.weight [512, 64] into the "
        f"draft.")


# ------------------------------------------- variants that load: pinned so they keep loading
KIMI_K2 = TargetInfo("DeepseekV3ForCausalLM", "kimi_k2", 61, 64, 512, "tiny-kimi-k2")


def test_specforge_kimi_k2_config(tmp_path, tiny_draft):
    # SpecForge configs/kimi-k2-eagle3.json: model_type kimi_k2, head_dim x heads != hidden
    # (128 x 64 vs 7168; here 16 x 8 vs 64), ids [2, 30, 58], no eagle3_target.
    cfg = {"architectures": ["LlamaForCausalLMEagle3"],
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58],
                            "use_aux_hidden_state": True},
           "attention_bias": False, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
           "intermediate_size": 128, "max_position_embeddings": 131072, "model_type": "kimi_k2",
           "num_attention_heads": 8, "num_hidden_layers": 1, "num_key_value_heads": 8,
           "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 512,
           "draft_vocab_size": 128}
    sd = tiny_draft(dtype="bfloat16", embed=False, num_attention_heads=8, num_key_value_heads=8,
                    head_dim=16).state_dict
    assert tuple(sd["midlayer.self_attn.q_proj.weight"].shape) == (128, 128)
    d = load_draft(_publish(tmp_path, "kimi", cfg, dict(sd)), target=KIMI_K2)
    # deepseek_v2 rule: ids not starting with 1 are taken verbatim.
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:30", "layer_input:58"]
    assert (d.config.head_dim, d.config.num_attention_heads) == (16, 8)


def test_eagle_repo_pickle_draft_needs_allow_pickle(tmp_path, tiny_draft):
    # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one-layer LlamaForCausalLM config, fp16
    # pytorch_model.bin with midlayer.*, fc, norm, lm_head, d2t, t2d and no embed_tokens.
    cfg = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001,
           "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
           "intermediate_size": 128, "max_position_embeddings": 2048, "model_type": "llama",
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
           "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True,
           "vocab_size": 512, "draft_vocab_size": 128}
    src = tmp_path / "eagle3-llama31"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    sd = dict(tiny_draft(dtype="float16", embed=False).state_dict)
    torch.save(sd, src / "pytorch_model.bin")
    llama31 = TargetInfo("LlamaForCausalLM", "llama", 32, 64, 512, "tiny-llama31")
    with pytest.raises(CheckpointError, match=r"also take --allow-pickle"):
        load_draft(src, target=llama31)
    d = load_draft(src, target=llama31, allow_pickle=True)
    assert (d.format, d.layout_source, d.dtype) == ("eagle-repo", "assumed-default", "float16")
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:16", "layer_input:29"]


# ModelOpt's export (nvidia/*-Eagle3) for a gpt-oss target, tiny dims (the real one: hidden
# 2880, head_dim 64) and the target's YaRN rope as nvidia/gpt-oss-120b-Eagle3 publishes it.
MODELOPT_GPT_OSS = {
    "architectures": ["LlamaForCausalLMEagle3"], "hidden_act": "silu", "hidden_size": 64,
    "intermediate_size": 128, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 512, "draft_vocab_size": 512, "head_dim": 16,
    "mlp_bias": False, "pretraining_tp": 1, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32],
                     "use_aux_hidden_state": True,
                     "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                     "use_mtp_layernorm": False, "next_layer_regular": True,
                     "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 1}}
GPT_OSS = TargetInfo("GptOssForCausalLM", "gpt_oss", 36, 64, 512, "tiny-gpt-oss")


@pytest.fixture
def modelopt_weights(tiny_draft):
    """Full-vocabulary tensors with neither d2t nor t2d, as ModelOpt exports them."""
    return {k: v for k, v in tiny_draft(dtype="bfloat16", embed=False, draft_vocab_size=512)
            .state_dict.items() if k not in ("d2t", "t2d")}


def test_modelopt_export_loads_without_t2d(tmp_path, modelopt_weights):
    # ModelOpt's export (nvidia/*-Eagle3): extra eagle_config keys, mlp_bias/pretraining_tp,
    # d2t optional and no t2d; here the full-vocabulary case with neither.
    cfg = dict(MODELOPT_GPT_OSS, rope_scaling=None)
    sd = modelopt_weights
    d = load_draft(_publish(tmp_path, "modelopt", cfg, sd), target=GPT_OSS)
    assert d.layout.to_strings() == ["layer_input:2", "layer_input:18", "layer_input:33"]
    assert not d.has_d2t and torch.equal(d.state_dict["d2t"], torch.zeros(512, dtype=torch.int64))


def test_yarn_rope_gpt_oss_draft_loads_and_converts_unchanged(tmp_path, modelopt_weights,
                                                             tiny_target_config):
    # nvidia gpt-oss drafts carry the target's YaRN rope_scaling (truncate: false, which
    # SGLang 0.5.23 honours); the draft model runs it, and convert writes it back unchanged.
    src = _publish(tmp_path, "yarn", MODELOPT_GPT_OSS, modelopt_weights)
    d = load_draft(src, target=GPT_OSS)
    rs = d.config.rope_scaling
    assert (rs.rope_type, rs.factor, rs.truncate, rs.original_max_position_embeddings) == (
        "yarn", 32.0, False, 4096)
    assert rs.to_dict() == MODELOPT_GPT_OSS["rope_scaling"]
    target = tiny_target_config(architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                                num_hidden_layers=36)
    assert main(["convert", str(src), str(tmp_path / "sg"), "--to", "sglang",
                 "--target", str(target)]) == 0
    written = json.loads((tmp_path / "sg" / "config.json").read_text())
    assert written["rope_scaling"] == MODELOPT_GPT_OSS["rope_scaling"]
    assert written["max_position_embeddings"] == 131072
    assert main(["validate", str(tmp_path / "sg"), "--target", str(target)]) == 0


def test_unsupported_rope_type_is_refused_with_its_type(tmp_path, modelopt_weights):
    cfg = dict(MODELOPT_GPT_OSS, rope_scaling={"rope_type": "longrope", "factor": 32.0,
                                               "short_factor": [1.0] * 8, "long_factor": [1.0] * 8,
                                               "original_max_position_embeddings": 4096})
    src = _publish(tmp_path, "longrope", cfg, modelopt_weights)
    with pytest.raises(CheckpointError) as err:
        load_draft(src, target=GPT_OSS)
    assert str(err.value) == (
        f"{src}/config.json: rope_scaling type 'longrope' is not supported; expected 'linear', "
        f"'llama3', 'yarn' or no scaling. Drafts with other scaling types cannot be run by this "
        f"backend.")


#: DeepSeek-style yarn keys (mscale, mscale_all_dim) and no original length: it is taken
#: from max_position_embeddings and written explicitly; the rest comes back as it went in.
_YARN_ROPE = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0,
              "truncate": True, "mscale": 1.0, "mscale_all_dim": 0.8}


@pytest.mark.parametrize("rope, read", [
    (_YARN_ROPE, {**_YARN_ROPE, "original_max_position_embeddings": 256}),
    ({"type": "linear", "factor": 2}, {"rope_type": "linear", "factor": 2.0}),
], ids=["yarn", "linear"])
@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_scaled_rope_round_trips_through_convert(make_draft_checkpoint, tiny_target_config,
                                                 tmp_path, fmt, rope, read):
    src = make_draft_checkpoint("sglang", rope_scaling=rope, max_position_embeddings=256)
    d = load_draft(src)
    assert d.config.rope_scaling.to_dict() == read
    target = tiny_target_config()
    dst = tmp_path / f"out-{fmt}"
    assert main(["convert", str(src), str(dst), "--to", fmt, "--target", str(target)]) == 0
    back = load_draft(dst)
    assert back.config == d.config
    # SGLang serves the sglang one; a speculators checkpoint is for vLLM
    assert main(["validate", str(dst), "--target", str(target)]) == (0 if fmt == "sglang" else 1)
