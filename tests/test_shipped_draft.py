"""The shipped draft (drafts/smollm2-135m-eagle3, what `make demo` serves): strict SGLang
checkpoint for the bundled target, within the size budget, its recipe the Makefile's."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from eagle3_backend.checkpoint import load_draft
from eagle3_backend.cli import main
from eagle3_backend.target import TargetInfo

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "drafts" / "smollm2-135m-eagle3"


def _make_draft_command() -> list[str]:
    """The `eagle3 train` command `make draft` runs for its last stage, as make prints it
    (`make -n`: every stage's command, none run; the last stage's comes last)."""
    printed = subprocess.run(["make", "-n", "draft"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.replace("\\\n", " ")
    train = [line for line in printed.splitlines() if "-m eagle3_backend train" in line][-1]
    words = shlex.split(re.search(r"\belse\s+(.*?);\s*fi\s*$", train).group(1))
    return words[words.index("train") + 1:]


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


def test_the_shipped_draft_was_trained_by_the_makefile_recipe():
    """The report's command is the one `make draft` runs for its last stage: every flag of
    it with the same value (a float flag equal as a number), started from the stage before it
    (--init-from), and trained on every earlier stage's cache the Makefile adds, each over
    chats of its own that end where this stage's begin."""
    report = json.loads((SHIPPED / "train_report.json").read_text())
    got = _flags(shlex.split(report["command"]))
    make = _make_draft_command()
    want = _flags(make)
    assert "--first-conversation" in want and "--init-from" in want
    paths = {"--init-from", "--teacher-cache", "--add-teacher-cache", "--checkpoint-dir", "--out"}
    for word, value in want.items():
        if word in paths:  # where the make run keeps them; the report records its own
            assert word in got, word
            continue
        have = got.get(word)
        assert have == value or (isinstance(value, str) and isinstance(have, str)
                                 and float(have) == float(value)), (word, have, value)
    added = report["data"]["teacher"].get("added_caches", [])
    assert len(added) == make.count("--add-teacher-cache")
    spans = sorted(tuple(a["conversations"]) for a in added)
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:]))
    assert all(b <= int(want["--first-conversation"]) for _, b in spans)
