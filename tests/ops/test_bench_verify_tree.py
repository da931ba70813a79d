"""Smoke test of benchmarks/bench_verify_tree.py on CPU (tiny sizes)."""

from __future__ import annotations

import csv

import pytest
from kernel_testutil import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_verify_tree")


def _args(bench, tmp_path, *extra):
    return bench.parse_args(["--device", "cpu", "--b", "1", "3", "--rep", "1", "--warmup", "0",
                             "--out-dir", str(tmp_path), "--tag", "smoke", "--no-jit", *extra])


def test_bench_runs_on_cpu_and_writes_csv(bench, tmp_path):
    rows = bench.run(_args(bench, tmp_path))
    assert [(r["provider"], r["B"]) for r in rows] == [("torch", 1), ("triton", 1), ("torch", 3), ("triton", 3)]
    lines = (tmp_path / "verify_tree_smoke.csv").read_text().splitlines()
    assert any(ln.startswith("# command: python benchmarks/bench_verify_tree.py --device cpu") for ln in lines)
    table = list(csv.DictReader(ln for ln in lines if not ln.startswith("#")))
    assert len(table) == 4 and all(float(r["time_us"]) > 0 for r in table)


def test_random_trees_accept_paths_and_a_wrong_kernel_is_refused(bench, tmp_path, monkeypatch):
    import torch

    from eagle3_backend.ops import allocate_verify_outputs, verify_tree_greedy

    tree = bench.random_trees(16, 8, 4, torch.Generator().manual_seed(0))
    outs = allocate_verify_outputs(16, 8, 4, "cpu")
    verify_tree_greedy(*outs, **tree, backend="torch")
    assert int(outs.accept_token_num.max()) >= 2  # the trees exercise multi-token acceptance

    def wrong(predicts, accept_index, accept_token_num, *tree, backend=None, **named):
        verify_tree_greedy(predicts, accept_index, accept_token_num, *tree, backend="torch", **named)
        if backend == "triton":
            accept_token_num.add_(1)

    monkeypatch.setattr(bench, "verify_tree_greedy", wrong)
    with pytest.raises(SystemExit, match="triton differs from torch at B=1"):
        bench.run(_args(bench, tmp_path, "--providers", "torch", "triton"))


@pytest.mark.gpu
def test_bench_replays_the_kernels_from_a_cuda_graph(bench, tmp_path):
    """The torch reference reads the tree on the host and is timed eagerly only."""
    args = bench.parse_args(["--device", "cuda", "--b", "1", "8", "--rep", "2", "--warmup", "1",
                             "--out-dir", str(tmp_path), "--tag", "g", "--modes", "graph"])
    rows = bench.run(args)
    assert [(r["mode"], r["provider"], r["B"]) for r in rows] == [
        ("graph", p, b) for b in (1, 8) for p in ("triton", "cuda")]
