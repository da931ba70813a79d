"""Smoke test of benchmarks/bench_capture_into.py on CPU (tiny sizes)."""

from __future__ import annotations

import csv

import pytest
import torch
from kernel_testutil import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_capture_into")


def test_bench_runs_on_cpu_and_writes_csv(bench, tmp_path):
    args = bench.parse_args(["--device", "cpu", "--n", "1", "4", "--k", "3", "--hidden", "40", "--rep", "1",
                             "--warmup", "1", "--copy-mib", "1", "--out-dir", str(tmp_path), "--tag", "smoke",
                             "--no-plot", "--no-jit"])
    rows = bench.run(args)
    assert {r["provider"] for r in rows} == {"torch", "sglang_pack", "triton"}  # no cuda
    lines = (tmp_path / "capture_into_smoke.csv").read_text().splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    assert any(ln.startswith("# torch: ") for ln in header)
    from eagle3_backend.verify.report import git_revision

    commit = git_revision()["commit"]
    assert any(ln.startswith(f"# git: {commit[:12] if commit else 'unknown'}") for ln in header)
    assert any(ln.startswith("# command: ") and "--device cpu" in ln for ln in header)
    table = list(csv.DictReader(ln for ln in lines if not ln.startswith("#")))
    assert [(r["provider"], int(r["N"])) for r in table][:3] == [("torch", 1), ("sglang_pack", 1), ("triton", 1)]
    assert all(float(r["time_us"]) > 0 and float(r["copy_GBps"]) > 0 for r in table)


def test_bench_baselines_agree_and_wrong_kernel_is_refused(bench, tmp_path, monkeypatch):
    hiddens = [torch.randn(6, 8).to(torch.bfloat16) for _ in range(3)]
    residuals = [torch.randn(6, 8).to(torch.bfloat16) for _ in range(3)]
    packed = bench.PackEachCapture(6, 8, 3, torch.bfloat16, torch.device("cpu"))(hiddens, residuals)
    assert torch.equal(packed, bench.torch_sum_cat(hiddens, residuals))
    assert torch.equal(packed, torch.cat([h + r for h, r in zip(hiddens, residuals)], dim=1))
    out = torch.empty(6, 24, dtype=torch.bfloat16)
    assert torch.equal(bench.capture_all(out, hiddens, residuals, "torch"), packed)

    def wrong(buffer, slot, hidden, residual, backend):
        return buffer.zero_()

    monkeypatch.setattr(bench, "capture_into", wrong)
    args = bench.parse_args(["--device", "cpu", "--n", "4", "--hidden", "8", "--rep", "1", "--warmup", "0",
                             "--copy-mib", "1", "--out-dir", str(tmp_path), "--no-plot", "--no-jit",
                             "--providers", "torch", "triton"])
    with pytest.raises(SystemExit, match="triton differs from torch at N=4"):
        bench.run(args)


def test_graph_mode_needs_cuda(bench, capsys):
    assert bench.modes_for(torch.device("cpu"), ["graph", "eager"]) == ["eager"]
    assert "skipping graph mode" in capsys.readouterr().err
    with pytest.raises(ValueError, match="graph on CUDA only"):
        bench.time_ms(lambda: None, torch.device("cpu"), 0, 1, "graph")


@pytest.mark.gpu
def test_bench_times_every_provider_replayed_from_a_cuda_graph(bench, tmp_path):
    """Graph mode captures each provider's calls once and checks what the replays wrote
    against torch, so a kernel that only works when launched eagerly stops the run."""
    args = bench.parse_args(["--device", "cuda", "--n", "1", "64", "--hidden", "200", "--rep", "3",
                             "--warmup", "1", "--copy-mib", "8", "--out-dir", str(tmp_path), "--tag", "g",
                             "--modes", "eager", "graph"])
    rows = bench.run(args)
    assert [(r["mode"], r["provider"], r["N"]) for r in rows] == [
        (mode, p, n) for mode in ("eager", "graph") for n in (1, 64) for p in bench.PROVIDERS]
    assert all(r["time_us"] > 0 for r in rows)
    assert (tmp_path / "capture_into_g.png").is_file()
