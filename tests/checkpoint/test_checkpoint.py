"""Draft checkpoints: formats, layout precedence, strict loading, writers, conversions."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from eagle3_backend.checkpoint import (
    load_draft,
    save_sglang,
    save_speculators,
    to_layer_order,
    to_layout,
)
from eagle3_backend.errors import CheckpointError
from eagle3_backend.layout import Layout
from eagle3_backend.model import Eagle3DraftModel
from eagle3_backend.target import TargetInfo

DEFAULT30 = ["layer_input:2", "layer_input:15", "layer_input:27"]


def _cfg(path):
    return json.loads((path / "config.json").read_text())


def _same_tensors(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- formats
def test_sglang_round_trip_through_speculators_is_bit_identical(make_draft_checkpoint, tmp_path):
    src = make_draft_checkpoint("sglang", dtype="bfloat16")
    a = load_draft(src)
    assert (a.format, a.layout_source, a.dtype) == ("sglang", "explicit", "bfloat16")
    assert a.layout.to_strings() == DEFAULT30

    spec = save_speculators(a, tmp_path / "spec")
    cfg = _cfg(spec)
    assert cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # input of layer k
    assert cfg["torch_dtype"] == "bfloat16"
    assert "layers.0.self_attn.q_proj.weight" in load_file(str(spec / "model.safetensors"))

    b = load_draft(spec)
    assert (b.format, b.layout_source, b.layout) == ("speculators", "explicit", a.layout)
    back = save_sglang(b, tmp_path / "back")
    c = load_draft(back)
    assert c.layout == a.layout and c.dtype == "bfloat16"
    _same_tensors(a.state_dict, c.state_dict)
    _same_tensors(load_file(str(src / "model.safetensors")),
                  load_file(str(back / "model.safetensors")))
    assert _cfg(back)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]


def test_specforge_ids_become_speculators_ids(make_draft_checkpoint, tmp_path):
    # SpecForge [1, 14, 26] (output of layer k) == speculators [2, 15, 27] (input of layer k).
    src = make_draft_checkpoint("specforge")
    assert "eagle3_layout" not in _cfg(src) and "eagle3_target" not in _cfg(src)
    assert _cfg(src)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    target = TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "tiny")
    for kwargs in ({}, {"ids_as": "specforge"}, {"target": target}):
        d = load_draft(src, **kwargs)
        assert (d.format, d.layout_source) == ("sglang", "engine-ids")
        assert d.layout.to_strings() == DEFAULT30
        assert not d.config.has_embed_tokens
    d = load_draft(src, target=target)
    assert d.layout_explanation == ("eagle_config ids [1, 14, 26] read as SGLang 0.5.23 ids for "
                                    "LlamaForCausalLM = " + str(Layout.parse(DEFAULT30)))
    out = save_speculators(d, tmp_path / "spec")
    assert _cfg(out)["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert _cfg(out)["eagle3_target"] == {"architecture": "LlamaForCausalLM",
                                          "num_hidden_layers": 30}


def test_specforge_ids_on_deepseek_target_are_reported(make_draft_checkpoint):
    # SGLang's deepseek_v2 rule takes ids verbatim unless ids[0] == 1: [2, 30, 58] means inputs
    # of 2, 30, 58 to SGLang but outputs of 2, 30, 58 (= inputs 3, 31, 59) to SpecForge.
    src = make_draft_checkpoint("specforge", ids=[2, 30, 58])
    ds = TargetInfo("DeepseekV3ForCausalLM", "deepseek_v3", 61, 64, 512, "dsv3")
    d = load_draft(src, target=ds)
    assert d.layout == Layout.of_layers([2, 30, 58])
    assert any("[layer_input:3, layer_input:31, layer_input:59] to SpecForge" in w
               for w in d.warnings)
    assert load_draft(src, target=ds, ids_as="specforge").layout == Layout.of_layers([3, 31, 59])
    unknown = load_draft(src)  # no target: llama rule, and a warning that DeepSeek reads it otherwise
    assert unknown.layout == Layout.of_layers([3, 31, 59])
    assert any("DeepSeek/Kimi" in w for w in unknown.warnings)


def test_specforge_unsorted_ids(make_draft_checkpoint, tiny_draft, tmp_path):
    # SpecForge concatenates in list order; SGLang in layer order.
    lay = "[layer_input:27, layer_input:2, layer_input:15]"
    src = make_draft_checkpoint("specforge", lay, ids=[26, 1, 14], sort=False)
    as_sglang = load_draft(src)
    assert as_sglang.layout.to_strings() == DEFAULT30
    assert any("are not ascending: SGLang concatenates captured states in layer order" in w
               for w in as_sglang.warnings)
    d = load_draft(src, ids_as="specforge")
    assert d.layout == Layout.parse(lay)
    t = TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "t")
    out = save_sglang(d, tmp_path / "fixed", target=t)
    fixed = load_draft(out)
    assert (fixed.layout_source, fixed.layout.to_strings()) == ("explicit", DEFAULT30)
    _same_tensors(fixed.state_dict, to_layer_order(tiny_draft(lay, embed=False)).state_dict)


def test_speculators_null_ids_need_target_then_are_an_assumption(make_draft_checkpoint):
    src = make_draft_checkpoint("speculators", ids=None, record_layout=False)
    assert _cfg(src)["eagle_aux_hidden_state_layer_ids"] is None
    with pytest.raises(CheckpointError, match=r"records eagle_aux_hidden_state_layer_ids null .*"
                                              r"Pass the target with --target"):
        load_draft(src)
    d = load_draft(src, target=TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "t"))
    assert (d.layout_source, d.layout.to_strings()) == ("assumed-default", DEFAULT30)
    assert any("assumed the speculators/vLLM default for a 30-layer target" in w
               for w in d.warnings)


def test_speculators_ids_without_explicit_layout(make_draft_checkpoint):
    src = make_draft_checkpoint("speculators", layout="[embed, layer_input:3, layer_input:16]",
                                record_layout=False)
    d = load_draft(src)
    assert (d.layout_source, d.layout.to_strings()) == (
        "engine-ids", ["embed", "layer_input:3", "layer_input:16"])
    assert d.target_architecture == "LlamaForCausalLM"  # from speculators_config.verifier


def test_eagle_repo_layout_is_the_hard_coded_default(make_draft_checkpoint):
    src = make_draft_checkpoint("eagle-repo", record_layout=False)
    with pytest.raises(CheckpointError, match="EAGLE-repo checkpoint, which records no layer ids"):
        load_draft(src)
    d = load_draft(src, target=TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "t"))
    assert (d.format, d.layout_source, d.layout.to_strings()) == (
        "eagle-repo", "assumed-default", DEFAULT30)


def test_pickle_refused_then_loaded_with_allow_pickle(make_draft_checkpoint, tmp_path):
    src = make_draft_checkpoint("sglang", pickle=True)
    assert not list(src.glob("*.safetensors"))
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin, which can run arbitrary code "
                                              r"when loaded, so they are refused.*--allow-pickle"):
        load_draft(src)
    d = load_draft(src, allow_pickle=True)
    _same_tensors(d.state_dict, load_draft(make_draft_checkpoint("sglang")).state_dict)
    out = save_sglang(d, tmp_path / "safe")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


# --------------------------------------------------------------------------- dtype
@pytest.mark.parametrize("dtype_key", ["dtype", "torch_dtype", None])
def test_dtype_kept_whatever_the_config_key(make_draft_checkpoint, tmp_path, dtype_key):
    # speculators' converter writes fp32 when the source says `dtype` instead of `torch_dtype`.
    src = make_draft_checkpoint("specforge", dtype="bfloat16", dtype_key=dtype_key)
    target = TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "t")
    d = load_draft(src)
    assert d.dtype == "bfloat16"
    for save, name in ((save_speculators, "spec"), (save_sglang, "sgl")):
        out = save(d, tmp_path / f"{name}-{dtype_key}", target=target)
        assert _cfg(out)["torch_dtype"] == "bfloat16"
        written = load_file(str(out / "model.safetensors"))
        assert {t.dtype for n, t in written.items() if n not in ("d2t", "t2d")} == {torch.bfloat16}


def test_config_dtype_disagreeing_with_weights_is_reported(make_draft_checkpoint):
    src = make_draft_checkpoint("sglang", dtype="bfloat16",
                                config_hook=lambda c: c.update(torch_dtype="float32"))
    d = load_draft(src)
    assert d.dtype == "bfloat16"
    assert any("config declares dtype float32 but the weights are bfloat16" in w
               for w in d.warnings)


# --------------------------------------------------------------------------- layer order
def test_unsorted_layout_is_written_in_layer_order_and_equivalent(tiny_draft, tmp_path):
    torch.manual_seed(0)
    draft = tiny_draft("[layer_input:15, embed, layer_input:27]", fc_norm=True,
                       norm_before_fc=True, fc_bias=True)
    ordered = to_layer_order(draft)
    assert ordered.layout.to_strings() == ["embed", "layer_input:15", "layer_input:27"]
    H = 64
    w, w2 = draft.state_dict["fc.weight"], ordered.state_dict["fc.weight"]
    for new, old in enumerate([1, 0, 2]):  # sorted slot i holds original chunk perm[i]
        assert torch.equal(w2[:, new * H:(new + 1) * H], w[:, old * H:(old + 1) * H])
        assert torch.equal(ordered.state_dict[f"fc_norm.{new}.weight"],
                           draft.state_dict[f"fc_norm.{old}.weight"])

    # Numerically the same draft: feed each its own layout order of the same target states.
    states = {s: torch.randn(2, 5, H) for s in draft.layout}
    ids = torch.randint(0, 512, (2, 5))
    outs = []
    for d in (draft, ordered):
        model = Eagle3DraftModel(d.config)
        model.load_state_dict(d.state_dict)
        hidden = torch.cat([states[s] for s in d.layout], dim=-1)  # [2, 5, 3*H]
        outs.append(model(ids, hidden, projected=False))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)
    # ... while feeding the sorted states to the unsorted draft is visibly different.
    model = Eagle3DraftModel(draft.config)
    model.load_state_dict(draft.state_dict)
    wrong = model(ids, torch.cat([states[s] for s in ordered.layout], dim=-1), projected=False)
    assert (wrong[0] - outs[0][0]).abs().max() > 1e-2

    # any order of the same sources round-trips exactly; other sources are refused by name
    back = to_layout(to_layout(ordered, Layout.parse("[layer_input:27, embed, layer_input:15]")),
                     draft.layout)
    assert back.layout == draft.layout
    for name, t in draft.state_dict.items():
        assert torch.equal(back.state_dict[name], t), name
    from eagle3_backend.errors import LayoutError
    with pytest.raises(LayoutError, match=r"cannot be reordered into \[embed, layer_input:3, "
                                          r"layer_input:27\]: different sources"):
        to_layout(draft, Layout.parse("[embed, layer_input:3, layer_input:27]"))

    out = save_sglang(draft, tmp_path / "sorted")
    cfg = _cfg(out)
    assert cfg["eagle3_layout"] == ["embed", "layer_input:15", "layer_input:27"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 14, 26]
    _same_tensors(load_draft(out).state_dict, ordered.state_dict)


def test_embed_layout_ids_per_engine(tiny_draft, tmp_path):
    draft = tiny_draft("[embed, layer_input:15, layer_input:27]")
    out = save_sglang(draft, tmp_path / "sgl")  # llama rule: id -1 captures the embedding
    assert _cfg(out)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 14, 26]
    assert load_draft(out).layout == draft.layout
    out = save_speculators(draft, tmp_path / "spec")  # vLLM/speculators id 0 is the embedding
    assert _cfg(out)["eagle_aux_hidden_state_layer_ids"] == [0, 15, 27]
    assert load_draft(out).layout == draft.layout


def test_last_layer_output_cannot_be_expressed_as_llama_sglang_ids(tiny_draft, tmp_path):
    draft = tiny_draft("[layer_input:2, layer_input:15, layer_input:30]")
    with pytest.raises(CheckpointError, match=r"cannot express layout \[layer_input:2, "
                                              r"layer_input:15, layer_input:30\] as SGLang ids "
                                              r"for LlamaForCausalLM with 30 layers"):
        save_sglang(draft, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    out = save_speculators(draft, tmp_path / "spec")
    assert _cfg(out)["eagle_aux_hidden_state_layer_ids"] == [2, 15, 30]


def test_unsorted_sglang_round_trip(tiny_draft, tmp_path):
    draft = tiny_draft("[layer_input:27, layer_input:2, layer_input:15]", fc_norm=True)
    out = save_sglang(draft, tmp_path / "o")
    d = load_draft(out)
    assert d.layout.to_strings() == DEFAULT30
    assert _cfg(out)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    _same_tensors(d.state_dict, to_layer_order(draft).state_dict)


# --------------------------------------------------------------------------- precedence
def test_explicit_layout_beats_ids_and_must_agree_with_them(make_draft_checkpoint):
    ok = load_draft(make_draft_checkpoint("sglang"))
    assert (ok.layout_source, ok.sglang_ids) == ("explicit", (1, 14, 26))
    bad = make_draft_checkpoint("sglang", ids=[2, 14, 26])
    with pytest.raises(CheckpointError, match=r"eagle3_layout is \[layer_input:2, layer_input:15, "
                                              r"layer_input:27\] but eagle_config ids \[2, 14, 26\] "
                                              r"make stock SGLang capture \[layer_input:3, "
                                              r"layer_input:15, layer_input:27\]"):
        load_draft(bad)


def test_no_ids_sglang_default_is_an_assumption(make_draft_checkpoint):
    src = make_draft_checkpoint("specforge", ids=None)
    with pytest.raises(CheckpointError, match="Pass the target with --target"):
        load_draft(src)
    d = load_draft(src, target=TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "t"))
    assert (d.layout_source, d.layout.to_strings()) == ("assumed-default", DEFAULT30)
    assert any("assumed SGLang's default for a 30-layer target" in w for w in d.warnings)


def test_top_level_ids_in_sglang_format_are_refused(make_draft_checkpoint):
    def move(c):
        c["eagle_aux_hidden_state_layer_ids"] = c["eagle_config"].pop(
            "eagle_aux_hidden_state_layer_ids")
    src = make_draft_checkpoint("specforge", config_hook=move)
    with pytest.raises(CheckpointError, match=r"SGLang 0.5.23 reads only the nested ids and would "
                                              r"silently capture its default layers"):
        load_draft(src)


# --------------------------------------------------------------------------- strict loading
def _drop(name):
    def hook(t):
        del t[name]
    return hook


def _set(name, fn):
    def hook(t):
        t[name] = fn(t[name].clone())
    return hook


def _poke(index, value):
    def fn(x):
        x.view(-1)[index] = value
        return x
    return fn


@pytest.mark.parametrize("hook, match", [
    (_drop("midlayer.mlp.down_proj.weight"),
     r"missing tensor\(s\) \['midlayer.mlp.down_proj.weight'\]"),
    (lambda t: t.update({"extra.weight": torch.zeros(3)}),
     r"unknown tensor\(s\) \['extra.weight'\]; expected only"),
    (lambda t: t.update({"layers.1.mlp.up_proj.weight": torch.zeros(3)}),
     r"unknown tensor\(s\) \['layers.1.mlp.up_proj.weight'\]"),
    (_set("lm_head.weight", lambda x: x[:100]),
     r"tensor 'lm_head.weight' has shape \[100, 64\]; expected \[128, 64\]"),
    (_set("d2t", _poke(5, 600)),
     r"d2t maps 1 draft id\(s\) outside the target vocabulary \[0, 512\) \(vocab_size\); first: "
     r"draft id 5 -> 5 \+ d2t\[5\] = \d+"),
    (_set("d2t", _poke(0, -1)), r"first: draft id 0 -> 0 \+ d2t\[0\] = -1"),
    (_set("t2d", lambda x: ~x), r"t2d marks 384 target ids; expected draft_vocab_size 128"),
    (_set("t2d", lambda x: x.roll(1)), r"t2d is false at \d+ target id\(s\) that d2t maps to"),
    (_set("fc.weight", _poke(7, float("nan"))),
     r"tensor 'fc.weight' holds 1 NaN and 0 Inf value\(s\) out of 12288"),
    (_set("norm.weight", _poke(0, float("inf"))),
     r"tensor 'norm.weight' holds 0 NaN and 1 Inf value\(s\) out of 64"),
    (_set("d2t", lambda x: x.float()), r"d2t has dtype torch.float32; expected an integer tensor"),
])
def test_each_rejection(make_draft_checkpoint, hook, match):
    src = make_draft_checkpoint("sglang", tensors_hook=hook)
    with pytest.raises(CheckpointError, match=match) as err:
        load_draft(src)
    assert str(src) in str(err.value)


def test_fc_width_mismatch_vs_layout(make_draft_checkpoint):
    src = make_draft_checkpoint("sglang", config_hook=lambda c: c.update(
        eagle3_layout=["layer_input:2", "layer_input:15"],
        eagle_config={**c["eagle_config"], "eagle_aux_hidden_state_layer_ids": [1, 14]}))
    with pytest.raises(CheckpointError, match=r"fc.weight has shape \[64, 192\]; expected \[64, 128\]"
                                              r" = \[hidden_size, 2 layout sources \[layer_input:2, "
                                              r"layer_input:15\] x target_hidden_size 64\]"):
        load_draft(src)


def test_non_strict_lists_every_problem(make_draft_checkpoint):
    def hook(t):
        t.pop("norm.weight")
        t["junk"] = torch.zeros(1)
        t["fc.weight"] = t["fc.weight"].clone()
        t["fc.weight"][0, 0] = float("nan")
    src = make_draft_checkpoint("sglang", tensors_hook=hook)
    d = load_draft(src, strict=False)
    assert len(d.problems) == 3
    assert [str(p).split(": ", 1)[1][:20] for p in d.problems] == [
        "missing tensor(s) ['", "unknown tensor(s) ['", "tensor 'fc.weight' h"]
    with pytest.raises(CheckpointError, match=r"^3 problems:\n  - "):
        load_draft(src)


def test_duplicate_names_across_conventions(make_draft_checkpoint):
    def hook(t):
        t["layers.0.hidden_norm.weight"] = t["midlayer.hidden_norm.weight"].clone()
    with pytest.raises(CheckpointError, match=r"tensors '(midlayer|layers.0).hidden_norm.weight' "
                                              r"and '(midlayer|layers.0).hidden_norm.weight' are "
                                              r"both 'midlayer.hidden_norm.weight'; expected one"):
        load_draft(make_draft_checkpoint("sglang", tensors_hook=hook))


def test_legacy_names_are_read(make_draft_checkpoint):
    def hook(t):
        for i, old in enumerate(("low", "mid", "high")):
            t[f"aux_norm_{old}.weight"] = t.pop(f"fc_norm.{i}.weight")
        for k in [k for k in t if k.startswith("midlayer.")]:
            t["model.layers.0." + k[len("midlayer."):]] = t.pop(k)
    src = make_draft_checkpoint("sglang", fc_norm=True, tensors_hook=hook)
    d = load_draft(src)
    ref = load_draft(make_draft_checkpoint("sglang", fc_norm=True))
    _same_tensors(d.state_dict, ref.state_dict)


def test_full_vocabulary_without_maps(make_draft_checkpoint):
    def hook(t):
        del t["d2t"], t["t2d"]
    src = make_draft_checkpoint("sglang", draft_vocab_size=512, tensors_hook=hook)
    d = load_draft(src)
    assert not d.has_d2t
    assert torch.equal(d.state_dict["d2t"], torch.zeros(512, dtype=torch.int64))
    assert bool(d.state_dict["t2d"].all())


def test_missing_d2t_with_smaller_draft_vocab(make_draft_checkpoint):
    src = make_draft_checkpoint("sglang", tensors_hook=_drop("d2t"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) \['d2t'\]"):
        load_draft(src)


def test_two_layer_draft_keeps_its_upper_norm_across_formats(make_draft_checkpoint, tiny_target_config,
                                                            tmp_path):
    """Layer 1's input norm is hidden_norm in SGLang and input_layernorm in speculators:
    read from either, written to either, the same tensor is the same norm."""
    from safetensors.torch import load_file

    from eagle3_backend.cli import main

    spec = make_draft_checkpoint("speculators", num_hidden_layers=2)
    on_disk = load_file(spec / "model.safetensors")
    assert "layers.1.input_layernorm.weight" in on_disk and not any("hidden_norm" in k and
                                                                     k.startswith("layers.1") for k in on_disk)
    d = load_draft(spec)
    assert d.config.num_hidden_layers == 2
    assert torch.equal(d.state_dict["layers.1.hidden_norm.weight"],
                       on_disk["layers.1.input_layernorm.weight"])
    assert "layers.1.input_layernorm.weight" not in d.state_dict

    target = tiny_target_config()
    sg = tmp_path / "sg"
    assert main(["convert", str(spec), str(sg), "--to", "sglang", "--target", str(target)]) == 0
    written = load_file(sg / "model.safetensors")
    assert json.loads((sg / "config.json").read_text())["num_hidden_layers"] == 2
    assert torch.equal(written["layers.1.hidden_norm.weight"], on_disk["layers.1.input_layernorm.weight"])
    assert "layers.1.input_layernorm.weight" not in written
    back = tmp_path / "back"
    assert main(["convert", str(sg), str(back), "--to", "speculators", "--target", str(target)]) == 0
    again = load_file(back / "model.safetensors")
    assert set(again) == set(on_disk)
    assert all(torch.equal(again[k], on_disk[k]) for k in on_disk)
    assert main(["validate", str(sg), "--target", str(target)]) == 0


def test_sglang_upper_layer_input_layernorm(make_draft_checkpoint, caplog):
    """SGLang never reads layers 1+'s input_layernorm: next to hidden_norm it is dropped with
    a note; instead of hidden_norm it is refused (stock SGLang would serve an untrained norm)."""
    def add_unused(t):
        t["layers.1.input_layernorm.weight"] = torch.full((64,), 3.0)

    with caplog.at_level("WARNING"):
        d = load_draft(make_draft_checkpoint("sglang", num_hidden_layers=2, tensors_hook=add_unused))
    assert "layers.1.input_layernorm.weight" not in d.state_dict
    assert ("dropped layers.1.input_layernorm.weight: SGLang 0.5.23 normalises layer 1's input "
            "with layers.1.hidden_norm.weight and never reads it") in caplog.text

    def speculators_norm(t):
        t["layers.1.input_layernorm.weight"] = t.pop("layers.1.hidden_norm.weight")

    src = make_draft_checkpoint("sglang", num_hidden_layers=2, tensors_hook=speculators_norm)
    with pytest.raises(CheckpointError) as err:
        load_draft(src)
    assert str(err.value) == (
        f"{src}/model.safetensors: layer 1 normalises its input with input_layernorm and has no "
        f"hidden_norm, the speculators / vLLM convention in an SGLang-format checkpoint; SGLang "
        f"0.5.23 normalises layers 1+ with hidden_norm, so it would serve this layer with an "
        f"untrained norm, a different model. If the draft was trained that way, rename the "
        f"tensor to layers.1.hidden_norm.weight.")

    def both(t):
        t["layers.1.hidden_norm.weight"] = torch.ones(64)

    src = make_draft_checkpoint("speculators", num_hidden_layers=2, tensors_hook=both)
    with pytest.raises(CheckpointError, match=r"layer 1 has both input_layernorm and hidden_norm; "
                                              r"a speculators draft's layers 1\+ have one"):
        load_draft(src)


@pytest.mark.parametrize("weights, says", [(3, 1), (1, 2), (1, 30)])
def test_layer_count_must_match_the_weights(make_draft_checkpoint, weights, says):
    src = make_draft_checkpoint("sglang", num_hidden_layers=weights,
                                config_hook=lambda c: c.update(num_hidden_layers=says))
    held = " and layers.1..2.*" if weights == 3 else ""
    with pytest.raises(CheckpointError) as err:
        load_draft(src)
    assert str(err.value) == (
        f"{src}/model.safetensors: config.json says num_hidden_layers {says}, but the weights hold "
        f"{weights} decoder layer(s) (midlayer.*{held}); expected them equal. Set num_hidden_layers "
        f"to {weights} (a value like 30 is the target's layer count).")


# --------------------------------------------------------------------------- bad config
@pytest.mark.parametrize("hook, match", [
    (lambda c: c.update(hidden_size="64"), r"field 'hidden_size' is '64'; expected a positive integer"),
    (lambda c: c.pop("intermediate_size"), r"required field 'intermediate_size' is missing"),
    (lambda c: c.update(eagle3_layout=["layer_input:two"]), r"field 'eagle3_layout': cannot parse"),
    (lambda c: c.update(eagle3_layout="layer_input:2"), r"field 'eagle3_layout' is 'layer_input:2';"
                                                        r" expected a list"),
    (lambda c: {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30,
                "hidden_size": 64}, r"is not an EAGLE-3 draft.*not the target"),
    (lambda c: c.update(architectures=["Eagle3DeepseekV2ForCausalLM"]), r"MLA-attention"),
    (lambda c: c.update(num_aux_hidden_states=2), r"'num_aux_hidden_states' is 2, but the layout"),
    (lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
     r"rope_scaling type 'dynamic' is not supported: SGLang 0.5.23 rotates every position"),
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 0.5}),
     r"rope_scaling.beta_fast \(0.5\) is below beta_slow \(1.0\)"),
    (lambda c: c.update(original_max_position_embeddings=2048, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}),
     r"'original_max_position_embeddings' is 2048 but rope_scaling's is 4096"),
])
def test_bad_config_fields(make_draft_checkpoint, hook, match):
    src = make_draft_checkpoint("sglang", config_hook=hook)
    with pytest.raises(CheckpointError, match=match) as err:
        load_draft(src)
    assert "config.json" in str(err.value)


def test_malformed_config_json(make_draft_checkpoint):
    src = make_draft_checkpoint("sglang")
    (src / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"],,}')
    with pytest.raises(CheckpointError, match=r"config.json: is not valid JSON \(line 1, column 46"):
        load_draft(src)
    (src / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"top level is a JSON list; expected an object"):
        load_draft(src)
    (src / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config.json"):
        load_draft(src)


def test_missing_or_corrupt_weights(make_draft_checkpoint, tmp_path):
    src = make_draft_checkpoint("sglang")
    (src / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable safetensors file"):
        load_draft(src)
    (src / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights found; expected model.safetensors"):
        load_draft(src)
    with pytest.raises(CheckpointError, match=r"does not exist"):
        load_draft(tmp_path / "absent")


# --------------------------------------------------------------------------- writing
def test_refuses_non_empty_destination_and_keeps_it_on_error(tiny_draft, tmp_path, monkeypatch):
    draft = tiny_draft()
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "config.json").write_text("precious")
    with pytest.raises(CheckpointError, match=r"is not empty; refusing to overwrite.*--force"):
        save_sglang(draft, dst)

    import safetensors.torch

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(CheckpointError, match=r"writing .*dst failed \(\[Errno 28\] No space left on "
                                              r"device\); nothing was written .* is unchanged"):
        save_sglang(draft, dst, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]  # no temp dirs left behind
    assert (dst / "config.json").read_text() == "precious"
    monkeypatch.undo()

    save_sglang(draft, dst, force=True)
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]


def test_force_replaces_only_a_checkpoint_directory(tiny_draft, tmp_path, monkeypatch):
    """--force never deletes what eagle3 did not write: other files, subdirectories, the
    home directory, the input it was given, or what a symbolic link points at."""
    draft = tiny_draft()
    dst = tmp_path / "dst"
    dst.mkdir()
    for name in ("config.json", "model.safetensors", "train_report.json", "notes.txt"):
        (dst / name).write_text(name)
    (dst / "runs").mkdir()
    with pytest.raises(CheckpointError, match=r"holds notes.txt, runs, which are not draft "
                                              r"checkpoint files; --force replaces only"):
        save_sglang(draft, dst, force=True)
    assert sorted(p.name for p in dst.iterdir()) == [
        "config.json", "model.safetensors", "notes.txt", "runs", "train_report.json"]
    assert (dst / "config.json").read_text() == "config.json"

    home = tmp_path / "home"   # a stand-in $HOME that holds nothing but checkpoint files
    home.mkdir()
    (home / "config.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(CheckpointError, match=r"is the home directory or holds the current "
                                              r"directory; refusing to replace it"):
        save_sglang(draft, home, force=True)
    assert [p.name for p in home.iterdir()] == ["config.json"]
    monkeypatch.undo()

    src = tmp_path / "src"
    save_sglang(draft, src)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    for out, word in ((src, "is"), (tmp_path, "holds")):
        with pytest.raises(CheckpointError, match=rf"{word} the input .*would destroy it"):
            save_sglang(draft, out, force=True, sources=[src])
    link = tmp_path / "link"
    link.symlink_to(src)
    with pytest.raises(CheckpointError, match=r"is the input"):
        save_sglang(draft, link, force=True, sources=[src])
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before

    other = tmp_path / "other"
    other.mkdir()
    link.unlink()
    link.symlink_to(other)
    with pytest.raises(CheckpointError, match=r"is a symbolic link to .*other'; expected a new"):
        save_sglang(draft, link)
    assert link.is_symlink() and list(other.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "home", "link", "other", "src"]


_KILLED_WRITER = """
import os, signal, sys
import torch
from eagle3_backend.checkpoint import files

dst, when = sys.argv[1], sys.argv[2]
if when == "saving":        # SIGKILL halfway through writing the weights
    def save_file(tensors, path, metadata=None):
        open(path, "wb").write(b"half")
        os.kill(os.getpid(), signal.SIGKILL)
    import safetensors.torch
    safetensors.torch.save_file = save_file
else:                       # SIGKILL between moving the old checkpoint aside and the new in
    rename, calls = os.rename, []
    def killing_rename(a, b):
        calls.append(a)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        rename(a, b)
    files.os.rename = killing_rename
files.write_checkpoint(dst, {"new": True}, {"w": torch.ones(2)}, force=True)
"""


def _killed_write(dst, when: str) -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(dst), when],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def test_next_write_clears_what_a_killed_write_left(tiny_draft, tmp_path, caplog):
    """A SIGKILLed write leaves its temporary dir; the next write to the same place removes
    it, and puts back a checkpoint that a killed --force write had already moved aside."""
    import socket

    draft = tiny_draft()
    dst = tmp_path / "dst"
    _killed_write(dst, "saving")
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".dst.tmp-"), left
    # a live writer's dir (this process) and another machine's are not touched
    live = tmp_path / f".dst.tmp-{os.getpid()}@{socket.gethostname()}-abcd1234"
    remote = tmp_path / ".dst.tmp-1@some-other-host-abcd1234"
    live.mkdir()
    remote.mkdir()
    with caplog.at_level("WARNING", logger="eagle3_backend.checkpoint.files"):
        save_sglang(draft, dst)
    assert f"removed {tmp_path / left[0]}, left by a write to {dst} that was killed" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["dst", live.name, remote.name])
    live.rmdir()
    remote.rmdir()

    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    _killed_write(dst, "replacing")
    assert not dst.exists()  # killed after the old checkpoint moved aside
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == [".dst.old", ".dst.tmp"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="eagle3_backend.checkpoint.files"):
        with pytest.raises(CheckpointError, match=r"is not empty; refusing to overwrite"):
            save_sglang(draft, dst)  # the restored checkpoint is not replaced without --force
    assert f"restored {dst} from {tmp_path}/.dst.old-" in caplog.text
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["dst"]


def test_writer_needs_the_target(tiny_draft, tmp_path):
    draft = tiny_draft(target=None)
    with pytest.raises(CheckpointError, match=r"the target is not recorded.*Pass --target"):
        save_sglang(draft, tmp_path / "x")
    t = TargetInfo("LlamaForCausalLM", "llama", 30, 64, 512, "t")
    out = save_sglang(draft, tmp_path / "x", target=t)
    assert _cfg(out)["eagle3_target"] == {"architecture": "LlamaForCausalLM", "num_hidden_layers": 30}


def test_sglang_config_is_read_by_transformers(tiny_draft, tmp_path):
    from transformers import AutoConfig

    out = save_sglang(tiny_draft(dtype="bfloat16", fc_norm=True), tmp_path / "x")
    c = AutoConfig.from_pretrained(out)
    assert type(c).__name__ == "LlamaConfig"
    assert c.architectures == ["LlamaForCausalLMEagle3"]
    assert c.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert (c.draft_vocab_size, c.target_hidden_size, c.fc_norm, c.num_hidden_layers) == (
        128, 64, True, 1)
    assert c.dtype == torch.bfloat16


def test_speculators_refuses_what_it_cannot_express(tiny_draft, tmp_path):
    with pytest.raises(CheckpointError, match=r"\['fc_norm'\], which the speculators Eagle3 format "
                                              r"cannot express"):
        save_speculators(tiny_draft(fc_norm=True), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_sharded_safetensors_with_index(make_draft_checkpoint):
    from safetensors.torch import save_file

    src = make_draft_checkpoint("sglang")
    ref = load_draft(src)
    tensors = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:5],
              "model-00002-of-00002.safetensors": names[5:]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(src / file))
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    _same_tensors(load_draft(src).state_dict, ref.state_dict)
    # a shard named by a path out of the checkpoint is not read, even where it exists
    moved = src.parent / "model-00002-of-00002.safetensors"
    (src / moved.name).rename(moved)
    index["weight_map"] = {n: f"../{f}" if f == moved.name else f for n, f in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"names shard\(s\) \['../model-00002-of-00002."
                                              r"safetensors'\] outside"):
        load_draft(src)
    index["weight_map"] = {n: f.removeprefix("../") for n, f in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"names shard\(s\) \['model-00002-of-00002."
                                              r"safetensors'\] that are not in"):
        load_draft(src)


def test_speculators_training_only_tensors_are_dropped_with_a_note(make_draft_checkpoint):
    def hook(t):
        t["verifier_lm_head.weight"] = torch.zeros(128, 64)
        t["verifier_norm.weight"] = torch.ones(64)
    d = load_draft(make_draft_checkpoint("speculators", tensors_hook=hook))
    assert "verifier_lm_head.weight" not in d.state_dict
    assert any("dropped training-only tensors ['verifier_lm_head.weight', "
               "'verifier_norm.weight']" in w for w in d.warnings)


def test_top_level_original_length_fills_a_yarn_dict(make_draft_checkpoint):
    # SGLang's llama model and transformers' standardize_rope_params both take it
    src = make_draft_checkpoint("sglang", config_hook=lambda c: c.update(
        original_max_position_embeddings=64, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    assert load_draft(src).config.rope_scaling.original_max_position_embeddings == 64
