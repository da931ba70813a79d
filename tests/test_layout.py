"""The canonical layout and every engine translation (one test per row of the conventions
table in docs/design.md, "The bug class this project exists to end")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_backend.errors import LayoutError
from eagle3_backend.layout import EMBED, SGLANG_ID, Layout, Source, sglang_id_rule
from eagle3_backend.plan import ARCHS

KIMI_LAYERS, KIMI_HIDDEN = 61, 7168


# --------------------------------------------------------------- parse / format
def test_parse_and_format_round_trip():
    lay = Layout.parse("[embed, layer_input:3, layer_input:31]")
    assert lay.sources == (Source(0), Source(3), Source(31))
    assert str(lay) == "[embed, layer_input:3, layer_input:31]"
    assert lay.to_strings() == ["embed", "layer_input:3", "layer_input:31"]
    assert Layout.parse(lay.to_strings()) == lay
    assert Layout.parse("embed,layer_input:3 , layer_input:31") == lay


def test_layer_input_zero_is_embed():
    assert Source.parse("layer_input:0") == EMBED
    assert str(Source.parse("layer_input:0")) == "embed"


@pytest.mark.parametrize(
    "bad", ["", "[]", "layer:3", "layer_input:-1", "layer_input:x", "embedding", "[embed, embed]"]
)
def test_parse_rejects_malformed(bad):
    with pytest.raises(LayoutError):
        Layout.parse(bad)


def test_duplicate_source_message_names_it():
    with pytest.raises(LayoutError, match="layer_input:3 twice"):
        Layout.parse("[layer_input:3, layer_input:31, layer_input:3]")


# ------------------------------------------------------------ Kimi-K2 example
def test_kimi_k2_fc_width_and_difference():
    trained = Layout.parse("[embed, layer_input:3, layer_input:31]")
    served = Layout.parse("[layer_input:3, layer_input:31, layer_input:59]")
    assert trained.fc_in_features(KIMI_HIDDEN) == 21504
    assert served.fc_in_features(KIMI_HIDDEN) == 21504  # same shape ...
    assert trained != served  # ... different meaning
    assert trained.describe_difference(served) == (
        "different sources: [embed, layer_input:3, layer_input:31] vs "
        "[layer_input:3, layer_input:31, layer_input:59]"
    )
    reordered = Layout.parse("[layer_input:3, embed, layer_input:31]")
    assert trained.describe_difference(reordered).startswith("same sources in a different order")
    assert trained.describe_difference(trained) is None


def test_check_range():
    Layout.parse("[embed, layer_input:61]").check_range(KIMI_LAYERS)
    with pytest.raises(LayoutError, match="layer_input:62"):
        Layout.parse("[layer_input:62]").check_range(KIMI_LAYERS)


# ---------------------------------------------------------- conventions table rows
def test_specforge_ids_are_layer_outputs_in_list_order():
    lay = Layout.from_specforge_ids([26, 1, 14])
    assert lay.to_strings() == ["layer_input:27", "layer_input:2", "layer_input:15"]
    assert lay.to_specforge_ids() == [26, 1, 14]
    with pytest.raises(LayoutError, match="embed"):
        Layout.parse("[embed, layer_input:3]").to_specforge_ids()


def test_specforge_equals_speculators_shifted_by_one():
    # docs/design.md, "Peer formats": SpecForge [1, 14, 26] == speculators [2, 15, 27]
    assert Layout.from_specforge_ids([1, 14, 26]) == Layout.from_speculators_ids([2, 15, 27])
    assert Layout.from_specforge_ids([1, 14, 26]).to_speculators_ids() == [2, 15, 27]


def test_speculators_ids_are_layer_inputs_and_zero_is_embed():
    lay = Layout.from_speculators_ids([0, 3, 31])
    assert lay == Layout.parse("[embed, layer_input:3, layer_input:31]")
    assert lay.to_vllm_ids() == [0, 3, 31]


@pytest.mark.parametrize("arch", ["llama", "LlamaForCausalLM", "qwen2", "qwen3", "qwen3_moe", "glm4_moe"])
def test_sglang_plus_one_family(arch):
    # model file: layers_to_capture = [id + 1 for id in ids]; id -1 captures the embedding
    assert Layout.from_sglang_ids([1, 14, 26], arch, 30).layers == (2, 15, 27)
    assert Layout.from_sglang_ids([-1, 2, 30], arch, 61).to_strings() == [
        "embed", "layer_input:3", "layer_input:31"]
    assert Layout.parse("[embed, layer_input:3, layer_input:31]").to_sglang_ids(arch, 61) == [-1, 2, 30]
    # SGLang concatenates in layer order whatever the list order
    assert Layout.from_sglang_ids([26, 1, 14], arch, 30).layers == (2, 15, 27)
    # the model file cannot capture the last layer's output
    with pytest.raises(LayoutError, match="cannot capture"):
        Layout.parse("[layer_input:2, layer_input:30]").to_sglang_ids(arch, 30)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3", "DeepseekV3ForCausalLM", "kimi_k2"])
def test_sglang_deepseek_v2_plus_one_only_when_first_id_is_one(arch):
    assert Layout.from_sglang_ids([1, 29, 57], arch, 61).layers == (2, 30, 58)
    assert Layout.from_sglang_ids([2, 30, 58], arch, 61).layers == (2, 30, 58)
    assert Layout.from_sglang_ids([3, 31, 59], arch, 61).layers == (3, 31, 59)
    assert Layout.from_sglang_ids([0, 3, 31], arch, 61).to_strings() == [
        "embed", "layer_input:3", "layer_input:31"]
    # the same ids mean different layers on a llama target
    assert Layout.from_sglang_ids([3, 31, 59], "llama", 61).layers == (4, 32, 60)
    kimi = Layout.parse("[embed, layer_input:3, layer_input:31]")
    assert kimi.to_sglang_ids(arch, 61) == [0, 3, 31]
    # first capture layer_input:2 -> ids [1, ...], right under both rules
    assert Layout.engine_default("sglang", 61).to_sglang_ids(arch, 61) == [1, 29, 57]
    # lowest capture layer_input:1: ids [1, ...] would be shifted, so 1 goes last (read verbatim)
    assert Layout.parse("[layer_input:1, layer_input:30]").to_sglang_ids(arch, 61) == [30, 1]
    with pytest.raises(LayoutError, match="layer_input:1 alone"):
        Layout.parse("[layer_input:1]").to_sglang_ids(arch, 61)


def test_sglang_gpt_oss_keeps_ids_reaching_the_last_layer():
    assert Layout.from_sglang_ids([1, 11, 21], "gpt_oss", 24).layers == (2, 12, 22)
    assert Layout.from_sglang_ids([2, 12, 24], "gpt_oss", 24).layers == (2, 12, 24)
    assert Layout.parse("[layer_input:2, layer_input:24]").to_sglang_ids("gpt_oss", 24) == [2, 24]
    assert Layout.parse("[layer_input:2, layer_input:23]").to_sglang_ids("gpt_oss", 24) == [1, 22]


def test_sglang_unordered_layout_is_refused_with_the_fix():
    with pytest.raises(LayoutError, match="eagle3 convert --to sglang"):
        Layout.parse("[layer_input:31, embed, layer_input:3]").to_sglang_ids("llama", 61)


def test_sglang_unknown_arch():
    with pytest.raises(LayoutError, match="no SGLang layer-id rule"):
        sglang_id_rule("mamba")


def test_eagle_repo_fixed_inputs():
    assert Layout.eagle_repo(32).to_strings() == ["layer_input:2", "layer_input:16", "layer_input:29"]
    assert Layout.eagle_repo(61).to_strings() == ["layer_input:2", "layer_input:30", "layer_input:58"]


@pytest.mark.parametrize("engine", ["sglang", "specforge", "speculators", "vllm", "eagle"])
def test_engine_defaults_agree_for_smollm2(engine):
    # every engine's default for a 30-layer target is inputs of 2, 15, 27
    assert Layout.engine_default(engine, 30).layers == (2, 15, 27)


def test_sglang_default_when_no_ids():
    assert Layout.from_sglang_ids(None, "llama", 30).layers == (2, 15, 27)


def test_sorted_order_permutation():
    lay = Layout.parse("[layer_input:31, embed, layer_input:3]")
    srt, perm = lay.sorted_order()
    assert srt.to_strings() == ["embed", "layer_input:3", "layer_input:31"]
    assert perm == (1, 2, 0)
    assert all(srt.sources[i] == lay.sources[p] for i, p in enumerate(perm))


# ------------------------------------------------------- round-trip properties
def _layouts(max_layers: int = 64):
    return st.integers(4, max_layers).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.integers(0, n), min_size=1, max_size=5, unique=True),
        )
    )


@settings(max_examples=200, deadline=None)
@given(_layouts())
def test_round_trip_speculators_and_strings(case):
    _, layers = case
    lay = Layout.of_layers(layers)
    assert Layout.from_speculators_ids(lay.to_speculators_ids()) == lay
    assert Layout.parse(str(lay)) == lay


@settings(max_examples=200, deadline=None)
@given(_layouts())
def test_round_trip_specforge(case):
    _, layers = case
    lay = Layout.of_layers([k for k in layers if k > 0] or [1])
    assert Layout.from_specforge_ids(lay.to_specforge_ids()) == lay


@settings(max_examples=300, deadline=None)
@given(_layouts(), st.sampled_from(sorted(SGLANG_ID)))
def test_round_trip_sglang_per_arch(case, arch):
    n, layers = case
    lay = Layout.of_layers(sorted(layers))
    try:
        ids = lay.to_sglang_ids(arch, n)
    except LayoutError:
        rule = sglang_id_rule(arch)
        # the only layouts stock SGLang cannot express
        assert (rule != "gpt_oss" and lay.layers[-1] == n) or (
            rule == "deepseek_v2" and lay.layers[0] == 1)
        return
    assert Layout.from_sglang_ids(ids, arch, n) == lay


@pytest.mark.parametrize("layers", [4, 6])
def test_engine_default_never_names_one_state_twice(layers):
    # 4 layers gave [2, 2, 1], 6 gave [2, 3, 3]: two fc slots fed one state
    with pytest.raises(LayoutError, match=f"needs at least 7 decoder layers .three distinct states., got {layers}"):
        Layout.engine_default("sglang", layers, "LlamaForCausalLM")
    assert Layout.engine_default("sglang", 7).layers == (2, 3, 4)


def test_engine_default_on_a_tiny_target_names_the_fix():
    with pytest.raises(LayoutError) as info:
        Layout.engine_default("sglang", 2, "LlamaForCausalLM")
    assert str(info.value) == (
        "the engine default layout (inputs of layers 2, L//2, L-3) needs at least 7 decoder "
        "layers (three distinct states), got 2. Give the layout explicitly (eagle3 train and "
        "make-demo-draft take e.g. --layout \"[embed, layer_input:2]\").")
    assert str(Layout.parse("[embed, layer_input:2]")) == "[embed, layer_input:2]"


@pytest.mark.parametrize("arch", sorted(ARCHS))  # every target architecture the plugin serves
def test_one_id_rule_for_checkpoints_and_the_plugin(arch):
    """Every layer-ordered layout of an 8-layer target: the ids a checkpoint gets
    (to_sglang_ids) are the ids the plugin hands the model file (ServingPlan.model_ids),
    and reading them back (from_sglang_ids) gives the layout."""
    import itertools

    from eagle3_backend.layout import sglang_captures_last
    from eagle3_backend.plan import ServingPlan

    L = 8
    top = L + 1 if sglang_captures_last(arch) else L
    n = 0
    for k in (1, 2, 3):
        for caps in itertools.combinations(range(top), k):
            lay = Layout.of_layers(caps)
            try:
                ids = lay.to_sglang_ids(arch, L)
            except LayoutError as exc:  # only deepseek_v2's layer_input:1 alone
                assert caps == (1,) and "layer_input:1 alone" in str(exc), (arch, caps, exc)
                continue
            assert Layout.from_sglang_ids(ids, arch, L) == lay, (arch, caps, ids)
            plan = ServingPlan(layout=lay, architecture=arch, num_layers=L, hidden_size=8,
                               draft_path="d", layout_source="explicit")
            assert plan.model_ids() == ids, (arch, caps)
            n += 1
    assert n >= 8 + 28 + 56 - 1
