"""`eagle3 doctor --url` against a real SGLang EAGLE-3 server on this CPU.

One server launch (SmolLM2-135M fp32, chain of 3) that serves the wrong copy of
a real trained draft: the same weights with their fc slots mislabelled
(doctor_draft.MISLABEL), as a deployment pointed at a stale checkpoint does.

* doctor on the draft the server should serve: the served acceptance is far
  below what that draft gets offline -> SERVE MISMATCH, naming the served path;
* doctor on the draft the server does serve: served == offline (same dtype,
  same greedy answers) -> SERVE OK, while the layout check finds the mislabel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor_draft import NEW_TOKENS, PROMPTS, mislabel

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
    assert served["best"]["layout"] == ["layer_input:27", "layer_input:2", "layer_input:15"]
    assert s["verdict"] == "ok", s["message"]    # ... but the server serves this draft faithfully
    assert s["notes"] == [] and s["identical_answers"] == len(PROMPTS)
    assert abs(s["served_acceptance_length"] - s["offline_acceptance_length"]) <= 0.05, s
    # the served copy is the intended draft's weights: offline it gets what the server got
    assert abs(s["offline_acceptance_length"] - intended["serve"]["served_acceptance_length"]) <= 0.05
    assert png.stat().st_size > 10_000
