"""Capture-id translation per target architecture, asserted exactly, then run through the
installed SGLang model files' own ``set_eagle3_layers_to_capture``."""

from __future__ import annotations

import pkgutil
from types import SimpleNamespace

import pytest

from eagle3_backend.errors import LayoutError, ServingError
from eagle3_backend.layout import Layout
from eagle3_backend.plan import ARCHS, ServingPlan

KIMI = dict(architecture="DeepseekV3ForCausalLM", num_layers=61, hidden_size=7168)


def plan(layout: str, architecture: str, num_layers: int, hidden_size: int = 64) -> ServingPlan:
    return ServingPlan(layout=Layout.parse(layout), architecture=architecture, num_layers=num_layers,
                       hidden_size=hidden_size, draft_path="d", layout_source="explicit")


# (architecture, L, layout) -> (ids for the model file, layers_to_capture, arrival slots)
CASES = [
    ("LlamaForCausalLM", 30, "[embed, layer_input:3, layer_input:15]", [-1, 2, 14], (0, 3, 15), (0, 1, 2)),
    ("LlamaForCausalLM", 30, "[layer_input:2, layer_input:15, layer_input:27]", [1, 14, 26], (2, 15, 27), (0, 1, 2)),
    ("LlamaForCausalLM", 30, "[layer_input:27, embed, layer_input:15]", [-1, 14, 26], (0, 15, 27), (1, 2, 0)),
    ("MistralForCausalLM", 40, "[embed, layer_input:20, layer_input:37]", [-1, 19, 36], (0, 20, 37), (0, 1, 2)),
    ("Qwen2ForCausalLM", 28, "[layer_input:2, layer_input:14, layer_input:25]", [1, 13, 24], (2, 14, 25), (0, 1, 2)),
    ("Qwen3ForCausalLM", 36, "[embed, layer_input:18, layer_input:33]", [-1, 17, 32], (0, 18, 33), (0, 1, 2)),
    ("Qwen3MoeForCausalLM", 48, "[layer_input:46, layer_input:2]", [1, 45], (2, 46), (1, 0)),
    ("Glm4MoeForCausalLM", 92, "[embed, layer_input:46, layer_input:89]", [-1, 45, 88], (0, 46, 89), (0, 1, 2)),
    # deepseek_v2 rule: ids used verbatim unless ids[0] == 1, then all get +1
    ("DeepseekV3ForCausalLM", 61, "[embed, layer_input:3, layer_input:31]", [0, 3, 31], (0, 3, 31), (0, 1, 2)),
    ("DeepseekV3ForCausalLM", 61, "[layer_input:2, layer_input:30, layer_input:58]", [1, 29, 57], (2, 30, 58), (0, 1, 2)),
    ("DeepseekV3ForCausalLM", 61, "[layer_input:1, layer_input:30, layer_input:58]", [30, 58, 1], (1, 30, 58), (0, 1, 2)),
    ("KimiK25ForConditionalGeneration", 61, "[embed, layer_input:3, layer_input:31]", [0, 3, 31], (0, 3, 31), (0, 1, 2)),
    ("KimiK25ForConditionalGeneration", 61, "[layer_input:2, layer_input:30, layer_input:58]", [1, 29, 57], (2, 30, 58), (0, 1, 2)),
    ("Glm4MoeLiteForCausalLM", 47, "[layer_input:2, layer_input:23, layer_input:44]", [1, 22, 43], (2, 23, 44), (0, 1, 2)),
    ("Glm4MoeLiteForCausalLM", 47, "[layer_input:44, embed, layer_input:1]", [0, 1, 44], (0, 1, 44), (1, 2, 0)),
    ("DeepseekV32ForCausalLM", 61, "[embed, layer_input:3, layer_input:31]", [0, 3, 31], (0, 3, 31), (0, 1, 2)),
    ("GlmMoeDsaForCausalLM", 78, "[layer_input:2, layer_input:39, layer_input:75]", [1, 38, 74], (2, 39, 75), (0, 1, 2)),
    ("DeepseekV2ForCausalLM", 27, "[layer_input:24, layer_input:1, embed]", [0, 1, 24], (0, 1, 24), (2, 1, 0)),
    # gpt-oss rule: verbatim when max(ids) == L (the last layer's output), else +1
    ("GptOssForCausalLM", 24, "[layer_input:2, layer_input:12, layer_input:24]", [2, 12, 24], (2, 12, 24), (0, 1, 2)),
    ("GptOssForCausalLM", 24, "[embed, layer_input:12, layer_input:21]", [-1, 11, 20], (0, 12, 21), (0, 1, 2)),
]


@pytest.mark.parametrize("arch, L, layout, ids, caps, slots", CASES)
def test_translation_is_exact(arch, L, layout, ids, caps, slots):
    p = plan(layout, arch, L)
    assert p.model_ids() == ids
    assert p.capture_layers == caps
    assert p.arrival_slots == slots


def test_kimi_k2_three_slot_layout():
    p = plan("[embed, layer_input:3, layer_input:31]", **KIMI)
    assert p.fc_in_features == 21504
    assert p.model_ids() == [0, 3, 31]


def test_inexpressible_layouts_are_refused():
    with pytest.raises(LayoutError, match="layer_input:1 alone"):
        plan("[layer_input:1]", **KIMI)
    with pytest.raises(LayoutError, match="needs layer_input:30"):
        plan("[layer_input:2, layer_input:30]", "LlamaForCausalLM", 30)
    with pytest.raises(LayoutError, match="names layer_input:31"):
        plan("[layer_input:2, layer_input:31]", "LlamaForCausalLM", 30)
    with pytest.raises(ServingError, match="not supported"):
        plan("[layer_input:2]", "Gemma2ForCausalLM", 30)


def test_plan_round_trips_through_json():
    p = plan("[layer_input:27, embed, layer_input:15]", "LlamaForCausalLM", 30)
    assert ServingPlan.from_json(p.to_json()) == p
    with pytest.raises(ServingError, match="unreadable"):
        ServingPlan.from_json('{"layout": ["embed"]}')


# -------------------------------------------------------- the installed model files' own rule
def _run_model_file(arch: str, L: int, ids: list[int]) -> list[int]:
    """Call SGLang's set_eagle3_layers_to_capture of ``arch`` on a stand-in model object."""
    pytest.importorskip("sglang")
    cls = pkgutil.resolve_name(ARCHS[arch].model_class)
    inner = SimpleNamespace(layers_to_capture=[], layers=[SimpleNamespace() for _ in range(L)])
    if arch == "Qwen3MoeForCausalLM":  # hands the shifted ids to Qwen2MoeModel's setter
        inner_setter = pkgutil.resolve_name(
            "sglang.srt.models.qwen2_moe.Qwen2MoeModel.set_eagle3_layers_to_capture")
        inner.set_eagle3_layers_to_capture = lambda caps: inner_setter(inner, caps)
    fake = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                           config=SimpleNamespace(num_hidden_layers=L), model=inner,
                           capture_aux_hidden_states=False)
    if arch == "KimiK25ForConditionalGeneration":  # the wrapper calls its language model's setter
        lm_setter = pkgutil.resolve_name(
            "sglang.srt.models.deepseek_v2.DeepseekV3ForCausalLM.set_eagle3_layers_to_capture")
        fake.set_eagle3_layers_to_capture = lambda layer_ids: lm_setter(fake, layer_ids)
        cls.set_eagle3_layers_to_capture(SimpleNamespace(language_model=fake), ids)
    else:
        cls.set_eagle3_layers_to_capture(fake, ids)
    assert fake.capture_aux_hidden_states is True
    if arch == "Qwen3MoeForCausalLM":
        flagged = [i for i, layer in enumerate(inner.layers) if getattr(layer, "_is_layer_to_capture", False)]
        assert flagged == sorted(inner.layers_to_capture)
    return sorted(inner.layers_to_capture)


@pytest.mark.sglang
@pytest.mark.parametrize("arch, L, layout, ids, caps, slots", CASES)
def test_model_file_captures_the_plan(arch, L, layout, ids, caps, slots):
    p = plan(layout, arch, L)
    assert _run_model_file(arch, L, p.model_ids()) == list(p.capture_layers)


@pytest.mark.sglang
def test_every_supported_arch_has_a_case():
    assert {c[0] for c in CASES} == set(ARCHS)
