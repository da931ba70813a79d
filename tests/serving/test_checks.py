"""Pre-load refusals, in process (no SGLang needed): one named defect per draft (the defects
validate and a real server start must refuse alike: test_verdicts.py)."""

from __future__ import annotations

import logging

import pytest
from serving_drafts import DRAFT_VOCAB, HIDDEN, tiny_target, write_draft

from eagle3_backend.errors import CheckpointError, LayoutMismatch, ServingError
from eagle3_backend.layout import Layout
from eagle3_backend.checkpoint import suite
from eagle3_backend.serving import checks
from eagle3_backend.serving.checks import LaunchArgs, check_launch

NO_ENV: dict[str, str] = {}


def eagle3(path) -> LaunchArgs:
    return LaunchArgs(algorithm="EAGLE3", draft_path=str(path))


def test_good_draft_gives_the_plan(tmp_path):
    draft = write_draft(tmp_path / "d", layout=["layer_input:5", "embed", "layer_input:2"])
    plan = check_launch(eagle3(draft), tiny_target(), NO_ENV)
    assert plan.layout == Layout.parse("[layer_input:5, embed, layer_input:2]")
    assert plan.layout_source == "explicit"
    assert plan.capture_layers == (0, 2, 5)
    assert plan.arrival_slots == (1, 2, 0)
    assert plan.model_ids() == [-1, 1, 4]
    assert plan.fc_in_features == 3 * HIDDEN


def test_other_algorithms_are_left_alone(tmp_path):
    draft = write_draft(tmp_path / "d")
    assert check_launch(LaunchArgs(algorithm=None, draft_path=None), None, NO_ENV) is None
    assert check_launch(LaunchArgs(algorithm="NGRAM", draft_path=str(draft)), None, NO_ENV) is None


def test_num_aux_hidden_states_must_match_the_layout(tmp_path):
    # SGLang sizes fc and its buffers from it (len(eagle_config ids) without it: test_verdicts)
    draft = write_draft(tmp_path / "e", config_extra={"num_aux_hidden_states": 2})
    with pytest.raises(CheckpointError, match=r"'num_aux_hidden_states' is 2, but the layout"):
        check_launch(eagle3(draft), tiny_target(), NO_ENV)


def test_last_layer_output_is_served_where_the_model_file_captures_it(tmp_path):
    # refused on llama (test_verdicts)
    draft = write_draft(tmp_path / "d", layout=["embed", "layer_input:2", "layer_input:8"])
    plan = check_launch(eagle3(draft), tiny_target("GptOssForCausalLM"), NO_ENV)
    assert plan.model_ids() == [0, 2, 8]  # gpt-oss: verbatim because max(ids) == L


def test_no_recorded_layout_serves_the_engine_default_loudly(tmp_path, caplog):
    draft = write_draft(tmp_path / "d", layout=None)
    # no eagle3_layout and no eagle_config ids at all
    raw = (draft / "config.json").read_text()
    assert "eagle3_layout" not in raw and "eagle_aux_hidden_state_layer_ids" not in raw
    with caplog.at_level(logging.WARNING, logger="eagle3_backend.serving.checks"):
        plan = check_launch(eagle3(draft), tiny_target(), NO_ENV)
    assert plan.layout == Layout.parse("[layer_input:2, layer_input:4, layer_input:5]")
    assert plan.layout_source == "assumed-default"
    loud = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("RECORDS NO LAYOUT; serving the engine default [layer_input:2, layer_input:4, "
               "layer_input:5]" in m and checks.LAYOUT_ENV in m for m in loud), loud


def test_layout_env_names_an_unrecorded_layout(tmp_path):
    draft = write_draft(tmp_path / "d", layout=None)
    env = {checks.LAYOUT_ENV: "[embed, layer_input:3, layer_input:6]"}
    plan = check_launch(eagle3(draft), tiny_target(), env)
    assert plan.layout == Layout.parse(env[checks.LAYOUT_ENV])
    assert plan.layout_source == "env"


def test_layout_env_cannot_contradict_a_recorded_layout(tmp_path):
    draft = write_draft(tmp_path / "d")
    with pytest.raises(LayoutMismatch, match=r"EAGLE3_LAYOUT=.* records eagle3_layout \[embed"):
        check_launch(eagle3(draft), tiny_target(), {checks.LAYOUT_ENV: "[layer_input:1, layer_input:2, layer_input:3]"})
    same = {checks.LAYOUT_ENV: "embed, layer_input:2, layer_input:5"}
    assert check_launch(eagle3(draft), tiny_target(), same).layout_source == "explicit"


def test_ids_only_draft_is_read_by_the_target_rule(tmp_path):
    draft = write_draft(tmp_path / "d", layout=None, ids=[2, 4, 6])
    plan = check_launch(eagle3(draft), tiny_target(), NO_ENV)
    assert plan.layout == Layout.parse("[layer_input:3, layer_input:5, layer_input:7]")  # llama: +1
    assert plan.layout_source == "engine-ids"
    assert plan.model_ids() == [2, 4, 6]
    plan = check_launch(eagle3(draft), tiny_target("DeepseekV3ForCausalLM"), NO_ENV)
    assert plan.layout == Layout.parse("[layer_input:2, layer_input:4, layer_input:6]")  # verbatim
    # the same captures asked for as a checkpoint would write them (ids[0] == 1: +1)
    assert plan.model_ids() == [1, 3, 5] == plan.layout.to_sglang_ids("DeepseekV3ForCausalLM", 8)
    draft = write_draft(tmp_path / "e", layout=None, ids=[1, 4, 6])
    plan = check_launch(eagle3(draft), tiny_target("DeepseekV3ForCausalLM"), NO_ENV)
    assert plan.layout == Layout.parse("[layer_input:2, layer_input:5, layer_input:7]")  # ids[0]==1: +1


def test_kimi_k25_target_is_served_from_its_text_config(tmp_path):
    """Kimi-K2.5 keeps its language model (DeepSeek-V3) in text_config and hands the ids to it:
    the shape comes from there and the ids follow DeepSeek's rule."""
    from eagle3_backend.target import TargetInfo

    text = {"model_type": "kimi_k2", "num_hidden_layers": 8, "hidden_size": HIDDEN,
            "vocab_size": tiny_target().vocab_size}
    target = TargetInfo.from_hf_dict({"architectures": ["KimiK25ForConditionalGeneration"],
                                      "model_type": "kimi_k25", "text_config": text,
                                      "vision_config": {"hidden_size": 32}}, source="k25")
    assert (target.architecture, target.num_hidden_layers, target.hidden_size) == (
        "KimiK25ForConditionalGeneration", 8, HIDDEN)
    draft = write_draft(tmp_path / "d", layout=None, ids=[1, 4, 6])
    plan = check_launch(eagle3(draft), target, NO_ENV)
    assert plan.layout == Layout.parse("[layer_input:2, layer_input:5, layer_input:7]")  # ids[0]==1: +1
    assert plan.model_ids() == [1, 4, 6]


def test_unsupported_target_and_parallel_setups_are_refused(tmp_path):
    draft = write_draft(tmp_path / "d")
    with pytest.raises(ServingError, match=r"'MixtralForCausalLM' is not supported"):
        check_launch(eagle3(draft), tiny_target("MixtralForCausalLM"), NO_ENV)
    with pytest.raises(ServingError, match=r"(?s)2 problems.*--pp-size 2.*--enable-two-batch-overlap"):
        check_launch(LaunchArgs("EAGLE3", str(draft), pp_size=2, two_batch_overlap=True),
                     tiny_target(), NO_ENV)


def _tree(draft, steps: int, topk: int, n: int) -> LaunchArgs:
    return LaunchArgs("EAGLE3", str(draft), num_steps=steps, topk=topk, num_draft_tokens=n)


@pytest.mark.parametrize("steps, topk, n", [(1, 2, 3), (3, 2, 11), (3, 8, 16), (5, 4, 8), (3, 4, 4),
                                            (1, 8, 2), (3, 1, 8), (3, None, 16)])
def test_tree_sizes_sglang_can_verify_pass(tmp_path, steps, topk, n):
    # (3, 1, 8): SGLang resizes a chain to steps + 1 itself; None: not resolved, not judged
    draft = write_draft(tmp_path / "d")
    assert check_launch(_tree(draft, steps, topk, n), tiny_target(), NO_ENV) is not None


@pytest.mark.parametrize("name, expected", [
    ("fc.weight", ("model.fc.weight", None)),
    ("model.fc.weight", ("model.fc.weight", None)),
    ("midlayer.self_attn.q_proj.weight", ("model.layers.0.self_attn.qkv_proj.weight", "q")),
    ("layers.0.mlp.up_proj.weight", ("model.layers.0.mlp.gate_up_proj.weight", 1)),
    ("aux_norm_mid.weight", (None, None)),  # fc_norm is off in this config
    ("lm_head.weight", ("lm_head.weight", None)),
    ("model.lm_head.weight", (None, None)),
    ("embed_tokens.weight", ("model.embed_tokens.weight", None)),
    ("d2t", ("<vocab map>", None)),
    ("midlayer.hidden_norm.weight", ("model.layers.0.hidden_norm.weight", None)),
])
def test_sglang_loader_model(name, expected):
    raw = {"num_hidden_layers": 1, "tie_word_embeddings": False, "draft_vocab_size": DRAFT_VOCAB}
    params = suite.sglang_draft_params(raw, 3)
    assert suite.sglang_load_target(name, params) == expected


def test_sglang_params_follow_the_config_flags():
    base = {"num_hidden_layers": 1}
    assert "model.fc.bias" not in suite.sglang_draft_params(base, 3)
    flags = suite.sglang_draft_params({**base, "bias": True, "fc_norm": True,
                                        "eagle_config": {"norm_before_fc": True},
                                        "tie_word_embeddings": True}, 3)
    assert {"model.fc.bias", "model.layers.0.self_attn.o_proj.bias", "model.input_norm.weight",
            "model.fc_norm.0.weight", "model.fc_norm.2.weight"} <= flags
    assert "lm_head.weight" not in flags and "model.fc_norm.3.weight" not in flags


def test_a_draft_path_that_is_not_there_is_refused_before_sglang_reads_it(tmp_path, monkeypatch,
                                                                         caplog):
    """SGLang 0.5.23 reads the draft's config while it resolves its arguments, before
    check_server_args: the plugin's BEFORE hook there refuses first (a launch with a hub id
    and HF_HUB_OFFLINE=1 ended in two huggingface_hub tracebacks, by hand on 12-07; now exit 2
    and this paragraph)."""
    from eagle3_backend.serving import runtime

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "file").write_text("x")
    cases = {str(tmp_path / "gone"): "does not exist", str(tmp_path / "file"): "is not a directory",
             "no-such-org/no-such-draft": "is not a local directory and could not be fetched"}
    for path, words in cases.items():
        caplog.clear()
        with pytest.raises(SystemExit) as stop:
            runtime.before_resolve_speculative_algorithm("EAGLE3", path, trust_remote_code=False)
        assert stop.value.code == 2
        assert f"eagle3_backend refuses to start: draft {path!r} {words}" in caplog.text
    assert runtime.before_resolve_speculative_algorithm("EAGLE", str(tmp_path / "gone")) is None
    assert runtime.before_resolve_speculative_algorithm("EAGLE3", str(tmp_path)) is None
