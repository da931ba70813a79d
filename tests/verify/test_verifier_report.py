"""Results files (machine, versions, settings, git revision) and PNG plots."""

from __future__ import annotations

import json

import pytest

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.verify.report import (
    git_revision,
    plot_acceptance_histogram,
    plot_spec_vs_baseline,
    plot_tokens_per_s_vs_concurrency,
    versions,
    write_results,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_write_results_records_environment(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["eagle3", "eval", "--name", "eval test"])
    path = write_results("eval-test", {"acceptance_length": 2.5}, {"speculative_num_steps": 3}, tmp_path)
    assert path == tmp_path / "eval-test.json"
    doc = json.loads(path.read_text())
    assert doc["name"] == "eval-test"
    assert doc["results"] == {"acceptance_length": 2.5}
    assert doc["settings"] == {"speculative_num_steps": 3}
    env = doc["environment"]
    assert env["machine"]["cpu_count"] >= 1
    assert env["versions"]["torch"] and env["versions"]["transformers"]
    assert env["versions"]["eagle3-backend"]
    assert set(env["git"]) == {"commit", "dirty"}
    assert env["command"] == "eagle3 eval --name 'eval test'"
    with pytest.raises(Eagle3Error, match="file stem"):
        write_results("../escape", {}, {}, tmp_path)


def test_git_revision_of_a_repo_and_a_non_repo(tmp_path):
    rev = git_revision()
    assert rev["commit"] is None or len(rev["commit"]) == 40
    assert git_revision(tmp_path) == {"commit": None, "dirty": None}
    assert versions(["definitely-not-a-package-xyz"]) == {"definitely-not-a-package-xyz": None}


def test_git_revision_never_writes_the_repository(tmp_path):
    """Reading the revision must not refresh (rewrite) .git/index: that takes
    .git/index.lock, which collides with the user's own git commands (and, under a file
    size limit, was left behind)."""
    import os
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f.txt").write_text("a")
    os.utime(repo / "f.txt", (1_000_000_000, 1_000_000_000))
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    os.utime(repo / "f.txt", (1_100_000_000, 1_100_000_000))  # stat differs, content the same
    index = repo / ".git" / "index"
    before = index.read_bytes()
    rev = git_revision(repo)
    assert len(rev["commit"]) == 40 and rev["dirty"] is False
    assert index.read_bytes() == before
    assert not (repo / ".git" / "index.lock").exists()


def test_plots_are_png(tmp_path):
    paths = [
        plot_acceptance_histogram([5, 3, 2, 1], tmp_path / "h.png"),
        plot_tokens_per_s_vs_concurrency({"spec": {1: 10.0, 4: 30.0}, "baseline": {1: 8.0, 4: 20.0}},
                                         tmp_path / "t.png"),
        plot_spec_vs_baseline(["c=1", "c=4"], [10.0, 30.0], [8.0, None], tmp_path / "s.png"),
    ]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000, p


def test_results_never_overwrite_a_file_that_is_not_results(tmp_path):
    """--name config --output-dir DRAFT would have replaced the draft's config.json; an
    earlier results file of the same name is still refreshed."""
    from eagle3_backend.verify.report import check_output_dir

    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (tmp_path / "notes.json").write_text("not json")
    for name in ("config", "notes"):
        message = (f"{tmp_path / (name + '.json')} exists and is not an eagle3 results file; "
                   "refusing to overwrite it. Choose another --name or --output-dir.")
        for call in (lambda: check_output_dir(name, tmp_path),
                     lambda: write_results(name, {}, {}, tmp_path)):
            with pytest.raises(Eagle3Error) as info:
                call()
            assert str(info.value) == message
    assert (tmp_path / "config.json").read_text() == '{"architectures": ["LlamaForCausalLMEagle3"]}'
    assert (tmp_path / "notes.json").read_text() == "not json"
    write_results("run", {"a": 1}, {}, tmp_path)
    assert check_output_dir("run", tmp_path) == tmp_path
    write_results("run", {"a": 2}, {}, tmp_path)
    assert json.loads((tmp_path / "run.json").read_text())["results"] == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "notes.json", "run.json"]


def test_write_text_atomic_replaces_whole_or_not_at_all(tmp_path):
    from eagle3_backend.verify.report import write_text_atomic

    path = tmp_path / "report.json"
    assert write_text_atomic(path, '{"a": 1}\n') == path
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n'
    with pytest.raises(UnicodeEncodeError):  # fails halfway through the write
        write_text_atomic(path, '{"b": "' + "x" * 10_000 + '\ud800"}')
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n', "the old file must survive a failed write"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"], "no temporary file left behind"
