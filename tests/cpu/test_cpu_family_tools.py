"""`eagle3 eval`, `eagle3 doctor`, `eagle3 train` and `eagle3 validate` on the MLA / MoE families
and the dense ones that only these tests run offline (no server): the small DeepSeek-V3, GLM-4.5
MoE, GLM-4.7-Flash, Qwen2 and Mistral targets of ``eagle3_backend.cpu.tiny_targets``
with the echo draft (accepted where the target repeats) and a freshly trained draft."""

from __future__ import annotations

import json

import pytest

from cpu_drafts import make_echo_draft

pytestmark = pytest.mark.slow

LAYOUT = "[layer_input:3, embed, layer_input:6]"


def _cli(capsys, *argv: str) -> tuple[int, str]:
    from eagle3_backend.cli import main

    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe", "glm4_moe_lite", "qwen2", "mistral"])
def test_eval_doctor_train_validate(family, family_target, capsys, tmp_path):
    target = family_target(family)
    echo = make_echo_draft(tmp_path / "echo", target, layout=LAYOUT)
    common = ("--target", str(target), "--dataset", "mt-bench", "--limit", "2", "--threads", "1",
              "--no-progress")

    code, out = _cli(capsys, "eval", "--draft", str(echo), *common, "--max-new-tokens", "24",
                     "--dtype", "float32", "--json")
    assert code == 0, out
    res = json.loads(out)
    assert res["outputs_identical"] is True, res
    assert res["acceptance_length"] > 2.0, res  # the chat-templated answers repeat in runs

    # the doctor finds that the echo draft fits its recorded layout (the embed slot, in its place)
    code, out = _cli(capsys, "doctor", str(echo), *common)
    assert code == 0 and out.strip().splitlines()[-1].startswith("OK"), out

    code, out = _cli(capsys, "train", "--target", str(target), "--dataset", "sharegpt", "--num-prompts", "6",
                     "--max-new-tokens", "12", "--steps", "12", "--seed", "0", "--threads", "1",
                     "--layout", LAYOUT, "--out", str(tmp_path / "trained"), "--no-progress")
    assert code == 0, out
    report = json.loads((tmp_path / "trained" / "train_report.json").read_text())
    assert report["training"]["steps"] == 12 and report["layout"] == ["layer_input:3", "embed", "layer_input:6"], report
    code, out = _cli(capsys, "validate", str(tmp_path / "trained"), "--target", str(target))
    # written in SGLang format: the same draft with its fc blocks in layer order
    assert code == 0 and "layout [embed, layer_input:3, layer_input:6] (explicit)" in out, out
