"""The shipped draft (drafts/smollm2-135m-eagle3, what `make demo` serves): strict SGLang
checkpoint for the bundled target, within the size budget, its recipe the Makefile's."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from eagle3_backend.checkpoint import load_draft
from eagle3_backend.cli import main
from eagle3_backend.target import TargetInfo

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "drafts" / "smollm2-135m-eagle3"


def _make_var(name: str) -> list[str]:
    """A `NAME ?= ...` variable of the Makefile (continuation lines joined), as words."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return shlex.split(re.search(rf"^{name} \?= (.*)$", text, re.M).group(1))


def test_the_shipped_draft_loads_strictly_for_the_bundled_target(bundled_gguf, capsys):
    files = sorted(p.name for p in SHIPPED.iterdir())
    assert files == ["config.json", "model.safetensors", "train_report.json"]
    assert sum(p.stat().st_size for p in SHIPPED.iterdir()) <= 25 * 2 ** 20
    info = TargetInfo.from_path(bundled_gguf)
    draft = load_draft(SHIPPED, target=info, strict=True)
    report = json.loads((SHIPPED / "train_report.json").read_text())
    assert draft.config.layout.to_strings() == report["layout"]
    assert draft.format == "sglang" and report["checkpoint"]["parameters"] == draft.num_parameters
    assert main(["validate", str(SHIPPED), "--target", str(bundled_gguf)]) == 0
    capsys.readouterr()


def test_the_shipped_draft_was_trained_by_the_makefile_recipe():
    """Every flag of DRAFT_ANSWER_ARGS (make draft's last stage) is in the report's command
    with the same value, and it started from stage 1 (--init-from)."""
    cmd = shlex.split(json.loads((SHIPPED / "train_report.json").read_text())["command"])
    got = {}
    for i, word in enumerate(cmd):
        if word.startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) and not cmd[i + 1].startswith("--") else True
            got[word] = nxt
    want = _make_var("DRAFT_ANSWER_ARGS")
    for i, word in enumerate(want):
        if word.startswith("--"):
            value = want[i + 1] if i + 1 < len(want) and not want[i + 1].startswith("--") else True
            have = got.get(word)
            assert have == value or (isinstance(value, str) and have is not True
                                     and have is not None and float(have) == float(value)), word
    assert "--init-from" in got
