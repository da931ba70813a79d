"""Smoke test of benchmarks/bench_gather_concat.py on CPU (tiny sizes)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gather_concat.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gather_concat", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_runs_on_cpu_and_writes_csv(bench, tmp_path):
    args = bench.parse_args(["--device", "cpu", "--n", "1", "4", "--k", "3", "--hidden", "40", "--rep", "1",
                             "--warmup", "1", "--copy-mib", "1", "--out-dir", str(tmp_path), "--tag", "smoke",
                             "--no-plot", "--no-jit", "--fc-out", "24"])
    rows = bench.run(args)
    assert {r["provider"] for r in rows} == {"torch", "sglang_pack", "triton", "fc_torch", "fc_triton"}  # no cuda
    lines = (tmp_path / "gather_concat_smoke.csv").read_text().splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    assert any(ln.startswith("# torch: ") for ln in header)
    assert any(ln.startswith("# command: ") and "--device cpu" in ln for ln in header)
    table = list(csv.DictReader(ln for ln in lines if not ln.startswith("#")))
    assert [(r["provider"], int(r["N"])) for r in table][:3] == [("torch", 1), ("sglang_pack", 1), ("triton", 1)]
    assert all(float(r["time_us"]) > 0 and float(r["copy_GBps"]) > 0 for r in table)
    fc = [r for r in table if r["provider"].startswith("fc_")]
    assert [(r["provider"], int(r["N"]), int(r["fc_out"])) for r in fc] == [
        ("fc_torch", 1, 24), ("fc_triton", 1, 24), ("fc_torch", 4, 24), ("fc_triton", 4, 24)]
    # TFLOPS is the GEMM's 2*N*D*K*H flops over the measured time.
    for r in fc:
        flops = 2 * int(r["N"]) * 24 * 3 * 40
        assert float(r["TFLOPS"]) == pytest.approx(flops / (float(r["time_us"]) * 1e-6) / 1e12, rel=1e-2, abs=1e-3)


def test_bench_baselines_agree_and_wrong_kernel_is_refused(bench, tmp_path, monkeypatch):
    sources = [torch.randn(6, 8).to(torch.bfloat16) for _ in range(3)]
    index = torch.tensor([5, 0, 3])
    packed = bench.PackThenSelect(6, 8, 3, torch.bfloat16, torch.device("cpu"))(sources, index)
    assert torch.equal(packed, bench.torch_index_cat(sources, index))
    assert torch.equal(packed, torch.cat([s[index] for s in sources], dim=1))

    def wrong(sources, index, out, backend):
        return out.zero_()

    monkeypatch.setattr(bench, "gather_concat", wrong)
    args = bench.parse_args(["--device", "cpu", "--n", "4", "--hidden", "8", "--rep", "1", "--warmup", "0",
                             "--copy-mib", "1", "--out-dir", str(tmp_path), "--no-plot", "--no-jit",
                             "--providers", "torch", "triton"])
    with pytest.raises(SystemExit, match="triton differs from torch at N=4"):
        bench.run(args)


def test_bench_refuses_a_wrong_fused_fc(bench, tmp_path, monkeypatch):
    real = bench.fused_fc

    def swapped(sources, weight, index, out=None, backend=None):  # sources in the wrong order
        if backend == "triton":
            sources = [sources[1], sources[0], *sources[2:]]
        return real(sources, weight, index, out=out, backend=backend)

    monkeypatch.setattr(bench, "fused_fc", swapped)
    args = bench.parse_args(["--device", "cpu", "--n", "4", "--hidden", "16", "--rep", "1", "--warmup", "0",
                             "--copy-mib", "1", "--out-dir", str(tmp_path), "--no-plot", "--no-jit",
                             "--providers", "fc_torch", "fc_triton", "--fc-out", "8"])
    with pytest.raises(SystemExit, match="fc_triton differs from fc_torch at N=4"):
        bench.run(args)
