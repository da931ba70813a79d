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


def _makefile() -> str:
    """The Makefile with its continuation lines joined."""
    return (ROOT / "Makefile").read_text().replace("\\\n", " ")


def _make_var(name: str) -> list[str]:
    """A `NAME ?= ...` variable of the Makefile, as words."""
    return shlex.split(re.search(rf"^{name} \?= (.*)$", _makefile(), re.M).group(1))


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


def _flags(words: list[str]) -> dict[str, str | bool]:
    """--flag value pairs (a bare flag: True); a repeated flag keeps its last value, as argparse."""
    got: dict[str, str | bool] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            got[word] = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
    return got


def _draft_rule() -> str:
    """The Makefile's `draft:` rule (the last stage), continuation lines joined."""
    return re.search(r"^draft: .*?(?=^\S)", _makefile(), re.M | re.S).group(0)


def _last_stage_args() -> str:
    """The name of the args variable the Makefile's `draft:` rule trains with."""
    return re.findall(r"\$\((DRAFT_STAGE\d+_ARGS)\)", _draft_rule())[-1]


def test_the_shipped_draft_was_trained_by_the_makefile_recipe():
    """make draft's last stage runs DRAFT_ANSWER_ARGS, DRAFT_MORE_ARGS, then its own stage's
    args (the later flag wins) from the previous stage's weights: every one of those flags is in
    the report's command with the same value, and it started from a draft (--init-from)."""
    got = _flags(shlex.split(json.loads((SHIPPED / "train_report.json").read_text())["command"]))
    stage = _make_var(_last_stage_args())
    want = _flags(_make_var("DRAFT_ANSWER_ARGS") + _make_var("DRAFT_MORE_ARGS") + stage)
    assert "--first-conversation" in stage
    for word, value in want.items():
        have = got.get(word)
        assert have == value or (isinstance(value, str) and isinstance(have, str)
                                 and float(have) == float(value)), (word, have, value)
    assert "--init-from" in got
    # every earlier stage's cache the rule adds was trained on, each over chats of its own
    rule = _draft_rule()
    added = json.loads((SHIPPED / "train_report.json").read_text())["data"]["teacher"].get(
        "added_caches", [])
    assert len(added) == rule.count("--add-teacher-cache")
    spans = sorted(tuple(a["conversations"]) for a in added)
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:]))
    assert all(b <= int(stage[stage.index("--first-conversation") + 1]) for _, b in spans)
