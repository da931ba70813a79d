"""Resumable `eagle3 train`: a run killed with SIGKILL, or stopped by --minutes, continues
from its last checkpoint when the same command runs again, and ends with the very weights
an uninterrupted run writes (fixed seed, one thread)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from eagle3_backend.cli import main
from eagle3_backend.train.trainer import TrainSettings, build_draft, train_draft

from test_train_teacher import write_conversation_file
from test_train_trainer import draft_config, synthetic_data

STEPS = 60


def _argv(target, convs, cache, out, ckpt, *extra):
    return ["train", "--target", str(target), "--dataset", str(convs), "--out", str(out),
            "--layout", "[layer_input:3, embed]", "--source", "teacher",
            "--teacher-cache", str(cache), "--teacher-tokens", "100000",
            "--draft-vocab", "256", "--batch-tokens", "128", "--heldout-fraction", "0.2",
            "--steps", str(STEPS), "--eval-every", "7", "--dtype", "float32",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1", "--threads", "1",
            "--no-progress", *extra]


def _weights(out):
    return load_file(str(out / "model.safetensors"))


def test_sigkilled_run_resumes_to_the_uninterrupted_weights(tmp_path, tiny_target_dir, capsys):
    convs = tmp_path / "convs.jsonl"
    write_conversation_file(convs, 12)
    cache = tmp_path / "teacher"
    ref_out = tmp_path / "ref"
    assert main(_argv(tiny_target_dir, convs, cache, ref_out, tmp_path / "ref.ckpt")) == 0
    ref = json.loads((ref_out / "train_report.json").read_text())
    assert ref["training"]["steps"] == STEPS and ref["training"]["resumed_from_step"] is None
    assert ref["data"]["source"] == "teacher" and ref["data"]["teacher"]["shards"] == 1
    # held-out top-1 per TTT step after every epoch (11 batches), every 7 steps and at the end
    curve = ref["training"]["heldout_curve"]
    assert [h["step"] for h in curve] == [7, 11, 14, 21, 22, 28, 33, 35, 42, 44, 49, 55, 56, 60]
    assert curve[1]["epoch"] == 1.0
    assert all(len(h["top1_by_position"]) == 3 for h in ref["training"]["heldout_curve"])
    assert json.loads((tmp_path / "ref.ckpt" / "checkpoint.json").read_text()) == {
        "step": STEPS, "total": STEPS, "finished": True}

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = [sys.executable, "-m", "eagle3_backend", *_argv(tiny_target_dir, convs, cache, out, ckpt)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = ckpt / "checkpoint.json"
    killed_at = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            step = json.loads(marker.read_text())["step"]
        except (OSError, ValueError):
            step = 0
        if step >= 10:
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = step
            break
        time.sleep(0.002)
    proc.wait()
    assert killed_at is not None, proc.stderr.read().decode()[-2000:]
    assert proc.returncode == -signal.SIGKILL
    saved = json.loads(marker.read_text())
    assert killed_at <= saved["step"] < STEPS and not saved["finished"]   # killed mid-way
    assert not (out / "train_report.json").exists()

    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((out / "train_report.json").read_text())
    assert report["training"]["resumed_from_step"] == saved["step"]
    got, want = _weights(out), _weights(ref_out)
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name                 # bit for bit
    for key in ("heldout_curve", "loss_first", "loss_last", "best_step",
                "train_top1_by_position", "heldout_top1_by_position"):
        assert report["training"][key] == ref["training"][key], key
    assert report["heldout_top1_by_position"] == ref["heldout_top1_by_position"]


def test_minutes_budget_stops_resumably_and_a_checkpoint_of_another_run_is_refused(
        tmp_path, tiny_target_dir, capsys):
    convs = tmp_path / "convs.jsonl"
    write_conversation_file(convs, 12)
    cache, out, ckpt = tmp_path / "teacher", tmp_path / "out", tmp_path / "ckpt"
    # the data pass fills the cache first (no budget), then a budget already spent
    assert main(_argv(tiny_target_dir, convs, cache, tmp_path / "o1", tmp_path / "c1")) == 0
    capsys.readouterr()
    assert main(_argv(tiny_target_dir, convs, cache, out, ckpt, "--minutes", "1e-6")) == 3
    err = capsys.readouterr().err
    assert (f"eagle3 train: unfinished: training stopped at the --minutes budget at step 0 of "
            f"{STEPS} (checkpoint in {ckpt}). Run the same command again to continue.") in err
    assert json.loads((ckpt / "checkpoint.json").read_text())["step"] == 0
    assert not out.exists() or not (out / "train_report.json").exists()
    # another run's settings in the same --checkpoint-dir: refused, naming the difference
    argv = _argv(tiny_target_dir, convs, cache, out, ckpt)
    argv[argv.index("--steps") + 1] = "61"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ckpt / 'state.pt'} belongs to another run (settings: " in err
    assert "delete it to start over" in err
    # the same command without the budget finishes, equal to the run that never stopped
    assert main(_argv(tiny_target_dir, convs, cache, out, ckpt)) == 0
    a, b = _weights(out), _weights(tmp_path / "o1")
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_train_draft_resumes_exactly_from_any_checkpoint(tmp_path):
    """In process: stopped by a deadline after 0 steps and killed state reloaded at every
    checkpoint interval, the final weights equal an uninterrupted run's."""
    from eagle3_backend.train.vocab import build_vocab_map, token_counts

    data = synthetic_data()
    vocab = build_vocab_map(token_counts([s.tokens for s in data.sequences], 96), 48)
    settings = TrainSettings(ttt_steps=2, steps=23, batch_tokens=40, lr=3e-3, warmup_steps=3)
    train, held = data.sequences[:5], data.sequences[5:]

    def run(ckpt, deadline=None):
        model = build_draft(draft_config(), data, vocab, seed=0)
        return train_draft(model, train, held, vocab, data.lm_head, settings, deadline=deadline,
                           checkpoint_dir=ckpt, checkpoint_every=4, eval_every=5)

    ref = run(None)
    stopped = run(tmp_path / "a", deadline=time.perf_counter() - 1)
    assert not stopped.finished and stopped.steps_done == 0
    done = run(tmp_path / "a")
    assert done.finished and done.resumed_from == 0
    for name, t in ref.model.state_dict().items():
        assert torch.equal(t, done.model.state_dict()[name]), name
    assert done.heldout_curve == ref.heldout_curve and done.best_step == ref.best_step
    assert done.loss_curve == ref.loss_curve


@pytest.mark.parametrize("bad", [b"", b"not a checkpoint"])
def test_a_damaged_checkpoint_is_a_clear_error(tmp_path, bad):
    from eagle3_backend.errors import Eagle3Error
    from eagle3_backend.train.trainer import load_checkpoint

    (tmp_path / "state.pt").write_bytes(bad)
    with pytest.raises(Eagle3Error, match=r"state.pt: not a readable checkpoint .*delete it"):
        load_checkpoint(tmp_path, {})
