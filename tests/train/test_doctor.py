"""`eagle3 doctor`: candidates, the paired statistics, and a real train/serve miswiring.

The end-to-end tests train a real draft on SmolLM2-135M (12 prompts, about a
minute), then mis-record its layout with ``eagle3 convert --layout`` the way a
list-order/layer-order mix-up does: the doctor must name the layout the draft
was trained on, and applying the fix it prints must give back a draft that
predicts exactly like the original.
"""

from __future__ import annotations

import json

import pytest
import torch

from doctor_draft import NEW_TOKENS, PROMPTS, TRAINED, mislabel

from eagle3_backend.cli import main
from eagle3_backend.doctor import (
    MISMATCH,
    OK,
    WEAK,
    Score,
    candidate_layouts,
    collect_states,
    diagnose,
    judge,
    paired_z,
)
from eagle3_backend.layout import Layout



def _layouts(cands):
    return [str(c.layout) for c in cands]


def test_candidates_of_a_llama_layout():
    cands = candidate_layouts(Layout.parse(TRAINED), num_layers=30)
    assert _layouts(cands) == [
        TRAINED,
        "[layer_input:1, layer_input:14, layer_input:26]",
        "[layer_input:3, layer_input:16, layer_input:28]",
        "[embed, layer_input:13, layer_input:25]",
        "[layer_input:4, layer_input:17, layer_input:29]",
        "[layer_input:2, layer_input:27, layer_input:15]",
        "[layer_input:15, layer_input:2, layer_input:27]",
        "[layer_input:15, layer_input:27, layer_input:2]",
        "[layer_input:27, layer_input:2, layer_input:15]",
        "[layer_input:27, layer_input:15, layer_input:2]",
    ]  # the engines' default is the recorded layout here, so it is not repeated
    assert cands[0].why == "recorded"


def test_candidates_of_a_kimi_layout_with_embed():
    cands = candidate_layouts(Layout.parse("[embed, layer_input:3, layer_input:31]"), num_layers=61)
    by_layout = {str(c.layout): c.why for c in cands}
    assert "[layer_input:1, layer_input:4, layer_input:32]" in by_layout      # +1: all slots
    assert "[layer_input:1, layer_input:3, layer_input:31]" in by_layout      # embed -> layer 1
    assert by_layout["[layer_input:2, layer_input:30, layer_input:58]"].startswith("the engines' default")
    assert all(min(c.layout.layers) >= 0 and max(c.layout.layers) <= 61 for c in cands)
    assert len(cands) == len(by_layout) == 1 + 2 + 5 + 1 + 1  # recorded, +1, +2, 5 orders, embed swap, default


def _score(name: str, hits: list[int]) -> Score:
    return Score(Layout.parse(name), name, torch.tensor(hits, dtype=torch.bool))


def test_paired_statistics_decide_the_verdict():
    recorded = "[layer_input:2, layer_input:15, layer_input:27]"
    other = "[layer_input:27, layer_input:15, layer_input:2]"
    base = [1] * 60 + [0] * 40
    # 10 tokens only `other` gets right: z = 10 / sqrt(10) = 3.16 -> mismatch
    verdict, message, z, ranked = judge([_score(recorded, base), _score(other, [1] * 70 + [0] * 30)])
    assert verdict == MISMATCH and z == pytest.approx(10 ** 0.5)
    assert str(ranked[0].layout) == other
    assert f'--layout "{other}"' in message
    # 12 better, 2 worse: z = 10 / sqrt(14) = 2.67 < 3 -> no evidence
    worse = [0, 0] + [1] * 58 + [1] * 12 + [0] * 28
    assert paired_z(_score(other, worse), _score(recorded, base)) == pytest.approx(10 / 14 ** 0.5)
    verdict, message, _, _ = judge([_score(recorded, base), _score(other, worse)])
    assert verdict == OK and "within noise" in message
    # below 10% everywhere: the layout is not the problem
    verdict, message, _, _ = judge([_score(recorded, [1] * 5 + [0] * 95), _score(other, [1] * 9 + [0] * 91)])
    assert verdict == WEAK and "vocabulary map" in message


@pytest.fixture(scope="module")
def smollm2():
    from eagle3_backend.verify.targets import load_target

    return load_target("bundled", "float32", "cpu")


@pytest.fixture(scope="module")
def states(smollm2, doctor_prompts_file):
    from eagle3_backend.verify.datasets import load_prompts

    return collect_states(smollm2, load_prompts(str(doctor_prompts_file)), max_new_tokens=NEW_TOKENS)


@pytest.mark.slow
def test_a_miswired_draft_is_found_and_the_printed_fix_restores_it(
        smollm2, states, doctor_draft, tmp_path):
    good = diagnose(doctor_draft, smollm2, states)
    assert good.verdict == OK, good.message
    assert str(good.recorded.layout) == TRAINED
    assert good.recorded.top1 > 0.5, good.recorded.top1   # on its training prompts

    # The fc slots trained on layers 2, 15, 27 labelled 15, 27, 2 (a list-order mix-up);
    # the writer stores the draft in layer order, so the recorded layout reads [2, 15, 27]
    # while slot 0 now holds the weights trained on layer 27.
    bad_dir = mislabel(doctor_draft, tmp_path / "bad")
    bad = diagnose(bad_dir, smollm2, states)
    assert str(bad.recorded.layout) == TRAINED
    assert bad.verdict == MISMATCH, bad.message
    assert str(bad.best.layout) == "[layer_input:27, layer_input:2, layer_input:15]"
    # The same draft read correctly: the fc sums its columns in another order, so a
    # near-tie may round the other way on some CPU; no more than one token.
    assert int((bad.best.hits != good.recorded.hits).sum()) <= 1
    assert bad.z >= 3 and bad.best.top1 - bad.recorded.top1 >= 0.02
    acc = bad.extra["expected_chain_acceptance"]
    assert acc["best"]["top1_by_step"][0] == pytest.approx(bad.best.top1, abs=1e-4)
    assert acc["recorded"]["top1_by_step"][0] == pytest.approx(bad.recorded.top1, abs=1e-4)
    assert acc["recorded"]["expected_acceptance_length"] < acc["best"]["expected_acceptance_length"]
    assert f'expected chain acceptance is {acc["recorded"]["expected_acceptance_length"]:.2f}' in bad.message

    fixed_dir = mislabel(bad_dir, tmp_path / "fixed", str(bad.best.layout))
    fixed = diagnose(fixed_dir, smollm2, states)
    assert fixed.verdict == OK, fixed.message
    assert str(fixed.recorded.layout) == TRAINED
    # the two relabellings compose to the identity: the original weights, bit for bit
    from safetensors.torch import load_file

    original, restored = load_file(doctor_draft / "model.safetensors"), load_file(fixed_dir / "model.safetensors")
    assert original.keys() == restored.keys()
    assert all(torch.equal(original[k], restored[k]) for k in original)
    assert torch.equal(fixed.recorded.hits, good.recorded.hits)
    assert (fixed.extra["expected_chain_acceptance"]["recorded"]
            == good.extra["expected_chain_acceptance"]["recorded"])


@pytest.mark.slow
def test_cli_exit_code_json_and_plot(doctor_draft, doctor_prompts_file, tmp_path, capsys):
    bad_dir = mislabel(doctor_draft, tmp_path / "bad")
    capsys.readouterr()
    png = tmp_path / "doctor.png"
    rc = main(["doctor", str(bad_dir), "--dataset", str(doctor_prompts_file), "--limit", str(len(PROMPTS)),
               "--max-new-tokens", str(NEW_TOKENS), "--json", "--plot", str(png), "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert report["verdict"] == MISMATCH
    assert report["best"]["layout"] == ["layer_input:27", "layer_input:2", "layer_input:15"]
    assert report["recorded"]["layout"] == ["layer_input:2", "layer_input:15", "layer_input:27"]
    assert report["prompts"] == len(PROMPTS) and report["answer_tokens"] >= report["recorded"]["scored"]
    assert png.stat().st_size > 10_000


def test_convert_layout_must_match_the_fc(doctor_draft, tmp_path, capsys):
    rc = main(["convert", str(doctor_draft), str(tmp_path / "x"), "--to", "sglang",
               "--layout", "[layer_input:2, layer_input:15]"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--layout [layer_input:2, layer_input:15] has 2 sources but the draft's fc reads 3" in err
    assert not (tmp_path / "x").exists()
