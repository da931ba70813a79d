"""`eagle3 doctor --url` against a real SGLang EAGLE-3 server on this CPU.

One server launch (SmolLM2-135M fp32, chain of 3) that serves the wrong copy of
a real trained draft: the same weights with their fc slots mislabelled
(doctor_draft.MISLABEL), as a deployment pointed at a stale checkpoint does.

* doctor on the draft the server should serve: the served acceptance is far
  below what that draft gets offline -> SERVE MISMATCH, naming the served path;
* doctor on the draft the server does serve: served == offline (same dtype,
  same greedy answers) -> SERVE OK, while the layout check finds the mislabel.

A second launch serves that draft with a second decoder layer added
(doctor_draft.with_second_layer): every prompt takes exactly the verify steps the
offline reference predicts, and the same draft with layer 1's hidden_norm left at ones
(what SGLang would run were the norm missing) predicts other counts, so the server ran
layer 1 as the reference does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor.doctor_draft import NEW_TOKENS, PROMPTS, mislabel, with_second_layer

from eagle3_backend.cli import main

pytestmark = [pytest.mark.server, pytest.mark.sglang, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _doctor(capsys, draft: Path, target: Path, url: str, prompts: Path, *extra: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["doctor", str(draft), "--target", str(target), "--url", url, "--dataset", str(prompts),
               "--limit", str(len(PROMPTS)), "--max-new-tokens", str(NEW_TOKENS), "--threads", "1",
               "--json", "--no-progress", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_doctor_url_tells_the_served_draft_from_the_intended_one(
        doctor_draft, doctor_prompts_file, smollm2_dir, plugin_site, tmp_path, capsys):
    from eagle3_backend.cpu.launch import CpuServer, ServerSpec

    served_dir = mislabel(doctor_draft, tmp_path / "stale-draft")
    spec = ServerSpec(str(smollm2_dir), str(served_dir), num_steps=3, topk=1, num_draft_tokens=4)
    png = tmp_path / "doctor.png"
    with CpuServer(spec, tmp_path / "server.log", pythonpath=(str(plugin_site), str(REPO)),
                   start_timeout=420.0) as srv:
        rc_intended, intended = _doctor(capsys, doctor_draft, smollm2_dir, srv.url,
                                        doctor_prompts_file, "--serve-only")
        rc_served, served = _doctor(capsys, served_dir, smollm2_dir, srv.url, doctor_prompts_file,
                                    "--plot", str(png))

    settings = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    s = intended["serve"]
    assert rc_intended == 1 and s["verdict"] == "mismatch", s["message"]
    assert "verdict" not in intended            # --serve-only: no layout scoring
    assert s["settings"] == settings and len(s["prompts"]) == len(PROMPTS)
    assert s["served_acceptance_length"] < s["offline_acceptance_length"]
    assert "the server loses" in s["message"] and s["paired_t"] <= -3
    assert s["notes"] == [f"the server serves the draft at {served_dir}, not {doctor_draft}"]
    assert s["identical_answers"] == len(PROMPTS)  # fp32 both sides: speculation is lossless

    s = served["serve"]
    assert rc_served == 1                        # the layout check still finds the mislabel ...
    assert served["verdict"] == "mismatch"
    # the slots' true order is the best, or a layout the doctor names as just as good (of
    # near-equal fits it names the plainest miswiring first: a draft trained here led with
    # [15, 2, 27] at 263 of 331 tokens, the truth at 277)
    assert ["layer_input:27", "layer_input:2", "layer_input:15"] in [
        served["best"]["layout"], *served["as_good_as_best"]], (served["best"], served["message"])
    assert s["verdict"] == "ok", s["message"]    # ... but the server serves this draft faithfully
    assert s["notes"] == [] and s["identical_answers"] == len(PROMPTS)
    assert abs(s["served_acceptance_length"] - s["offline_acceptance_length"]) <= 0.05, s
    # the served copy is the intended draft's weights: offline it gets what the server got
    assert abs(s["offline_acceptance_length"] - intended["serve"]["served_acceptance_length"]) <= 0.05
    assert png.stat().st_size > 10_000


def test_two_layer_draft_is_served_as_the_reference_runs_it(
        doctor_draft, doctor_prompts_file, smollm2_dir, plugin_site, tmp_path, capsys):
    from eagle3_backend.cpu.launch import CpuServer, ServerSpec

    two = with_second_layer(doctor_draft, tmp_path / "two-layer")
    ones = with_second_layer(doctor_draft, tmp_path / "two-layer-ones", hidden_norm="ones")
    spec = ServerSpec(str(smollm2_dir), str(two), num_steps=3, topk=1, num_draft_tokens=4)
    with CpuServer(spec, tmp_path / "server.log", pythonpath=(str(plugin_site), str(REPO)),
                   start_timeout=420.0) as srv:
        rc, served = _doctor(capsys, two, smollm2_dir, srv.url, doctor_prompts_file, "--serve-only")
        _, other = _doctor(capsys, ones, smollm2_dir, srv.url, doctor_prompts_file, "--serve-only")
        log = srv.log_text()
    assert "every one consumed by SGLang's loader" in log
    s = served["serve"]
    assert rc == 0 and s["verdict"] == "ok", s["message"]
    assert s["identical_answers"] == len(PROMPTS)
    steps = [(p["served"]["verify_steps"], p["offline"]["verify_steps"]) for p in s["prompts"]]
    assert all(a == b for a, b in steps), steps
    assert s["offline_acceptance_length"] > 2.0  # layer 1 moves proposals, it does not drown them
    # the reference with the other norm predicts other step counts for the same served run
    wrong = [p["offline"]["verify_steps"] for p in other["serve"]["prompts"]]
    assert wrong != [b for _, b in steps], wrong
