"""Benchmark: the few-row linear kernel against torch's CPU paths, on a real model's weights.

One sweep multiplies M rows through every linear weight of the target (SmolLM2-135M:
30 layers x q/k/v, o, gate/up, down, then the 49152 x 576 LM head; 538 MB fp32), in
model order, so each weight comes from memory as in a decode or verify step, never from
cache. Providers, each timed per M in rotation, round by round, so all see the same
background load; every result is first checked equal to ``F.linear`` (the kernel's up to
fp32 summation order):

  F.linear   torch's default (MKL): a matrix-vector product for one row, a GEMM for more
  onednn     ``packed_linear``'s prepacked oneDNN weight (the fallback without the kernel)
  kernel     ``small_gemm.small_linear`` (kernels/small_gemm.cpp)

Reported: the median ms of one sweep per (provider, M) and its ratio to F.linear's one row,
the cost a decode step pays today. Writes benchmarks/results/NAME.json (machine, versions,
git revision, command) and NAME.png.

    python benchmarks/bench_small_gemm.py                      # one thread, M = 1 2 4 6 8 16
    python benchmarks/bench_small_gemm.py --threads 2 --rows 1 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT),) if p not in sys.path]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from eagle3_backend.cpu import packed_linear, small_gemm  # noqa: E402


def linear_weights(target: Path) -> list[torch.Tensor]:
    """The target's 2-D linear weights in forward order (LM head last; the tied embedding
    when there is no separate head)."""
    from safetensors.torch import load_file

    state = {}
    for f in sorted(target.glob("*.safetensors")):
        state.update(load_file(str(f)))
    layer = lambda k: int(k.split(".layers.")[1].split(".")[0])  # noqa: E731
    keys = sorted((k for k, v in state.items() if v.dim() == 2 and ".layers." in k
                   and k.endswith(".weight")), key=lambda k: (layer(k), k))
    body = [state[k].float().contiguous() for k in keys]
    head = state.get("lm_head.weight", state.get("model.embed_tokens.weight"))
    if head is None:
        raise SystemExit(f"{target}: no lm_head.weight or model.embed_tokens.weight")
    return body + [head.float().contiguous()]


def providers(weights: list[torch.Tensor]) -> dict:
    mod = small_gemm.load()
    if mod is None:
        raise SystemExit(f"the kernel did not build here ({small_gemm.ENV}=0 or no compiler; "
                         "see the log above)")
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, packed_linear._PACK_HINT_ROWS)
              for w in weights]                    # packed as packed_linear packs a layer
    return {
        "F.linear": lambda x, i: F.linear(x, weights[i]),
        "onednn": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], ""),
        "kernel": lambda x, i: mod.small_linear(x, weights[i], None),
    }


def sweep(fn, xs: dict[int, torch.Tensor], weights: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    for i, w in enumerate(weights):
        fn(xs[w.shape[1]], i)
    return (time.perf_counter() - t0) * 1e3


def plot(summary: dict, rows: list[int], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, by_m in summary.items():
        ax.plot(rows, [by_m[str(m)]["over_f_linear_one_row"] for m in rows], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("rows multiplied (M)")
    ax.set_ylabel("sweep time / F.linear at one row")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "artifacts" / "smollm2-135m-instruct"))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 6, 8, 16])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="small-gemm")
    ap.add_argument("--output-dir", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if max(args.rows) > small_gemm.MAX_ROWS or min(args.rows) < 1:
        raise SystemExit(f"--rows must be 1..{small_gemm.MAX_ROWS}")
    from eagle3_backend.verify.report import environment

    torch.set_num_threads(args.threads)
    weights = linear_weights(Path(args.target))
    provs = providers(weights)
    gen = torch.Generator().manual_seed(0)
    times: dict[str, dict[int, list[float]]] = {p: {m: [] for m in args.rows} for p in provs}
    for m in args.rows:
        xs = {k: torch.randn(m, k, generator=gen) for k in {w.shape[1] for w in weights}}
        for j in (0, 1, 2, 3, len(weights) - 1):               # every provider agrees first
            w = weights[j]
            want = F.linear(xs[w.shape[1]].double(), w.double())
            for name, fn in provs.items():
                got = fn(xs[w.shape[1]], j).double()
                err = float((got - want).abs().max() / want.abs().max())
                if err > 1e-5:
                    raise SystemExit(f"{name} at M={m}, weight {j}: relative error {err:.2e}")
        for _ in range(args.rounds):
            for name, fn in provs.items():
                times[name][m].append(sweep(fn, xs, weights))
        print(f"M={m}: " + ", ".join(f"{n} {statistics.median(t[m]):.1f} ms"
                                      for n, t in times.items()), flush=True)
    base = statistics.median(times["F.linear"][1]) if 1 in args.rows else None
    summary = {name: {str(m): {"median_ms": round(statistics.median(t), 2),
                               "over_f_linear_one_row": round(statistics.median(t) / base, 3)
                               if base else None}
                      for m, t in by_m.items()} for name, by_m in times.items()}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    mb = sum(w.numel() for w in weights) * 4 / 1e6
    record = {"target": args.target, "weights": len(weights), "weight_mb_fp32": round(mb, 1),
              "threads": args.threads, "rounds": args.rounds, "summary": summary,
              "raw_ms": {n: {str(m): [round(v, 3) for v in t] for m, t in by_m.items()}
                         for n, by_m in times.items()},
              "environment": environment(), "command": ["python", *sys.argv]}
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / args.name}.json")
    if base:
        plot(summary, args.rows, out / f"{args.name}.png",
             f"{len(weights)} weights ({mb:.0f} MB fp32), {args.threads} thread(s), median of "
             f"{args.rounds}")


if __name__ == "__main__":
    main()
