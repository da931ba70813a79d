"""Which speculative tree pays on this CPU: real SGLang, one draft, several tree settings.

The target-only server and one EAGLE-3 server per ``STEPS,TOPK,TOKENS`` setting
(``--speculative-num-steps / --speculative-eagle-topk / --speculative-num-draft-tokens``)
are up together, ``--together`` settings at a time (a CPU server holds about 3 GB), and are
measured in rotation with SGLang's own client exactly as ``serve_demo.py`` does (MT-Bench
first turns, chat template, greedy, concurrency 1): every round runs each server once, so
the settings of a group share the same stretches of a noisy machine and their speed-ups
compare with each other, not only with target-only. Prints per setting SGLang's
acceptance length, output tok/s, the speed-up over target-only and whether every output is
identical; writes NAME.json (machine, versions, git revision, commands, every report) and
NAME.png.

    python benchmarks/tree_sweep.py --draft DIR
    python benchmarks/tree_sweep.py --draft DIR --settings 3,1,4 2,4,6 3,4,8 --prompts 16 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "benchmarks")) if p not in sys.path]

import serve_demo  # noqa: E402

from eagle3_backend.cpu.launch import ServerSpec  # noqa: E402

DEFAULT_SETTINGS = ("1,1,2", "2,1,3", "3,1,4", "5,1,6", "2,4,4", "3,4,8", "4,8,16")


def parse_setting(text: str) -> tuple[int, int, int]:
    try:
        steps, topk, tokens = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--settings {text!r}: expected STEPS,TOPK,TOKENS, e.g. 3,4,8") from None
    return steps, topk, tokens


def plot(path: Path, rows: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = [r["setting"] for r in rows]
    bars = ax.bar(names, [r["speedup"] for r in rows], color="#2a7ab9")
    for b, r in zip(bars, rows):
        ax.text(b.get_x() + b.get_width() / 2, r["speedup"],
                f"{r['speedup']:.2f}x\nacc {r['accept_length']}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="#888888", lw=1)
    ax.set_xlabel("num-steps, eagle-topk, num-draft-tokens")
    ax.set_ylabel("output tok/s over target-only")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", default=str(ROOT / "artifacts" / "smollm2-135m-instruct"))
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1, help="client runs per server, in rotation (default 1)")
    ap.add_argument("--chunk", type=int, default=4, help="prompts per client run, every server in turn (default 4)")
    ap.add_argument("--output-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="tree-sweep")
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "tree_sweep"))
    ap.add_argument("--together", type=int, default=3,
                    help="EAGLE-3 servers up at once beside target-only (default 3, ~3 GB each)")
    args = ap.parse_args()
    args.concurrency = [1]
    settings = [parse_setting(s) for s in args.settings]
    if args.together < 1:
        raise SystemExit("--together must be >= 1")

    from eagle3_backend.verify.report import environment

    work, target, dataset, n, pypath = serve_demo.prepare(args)
    draft = str(Path(args.draft).resolve())
    runs: dict = {}
    rows = []
    with contextlib.ExitStack() as stack:
        base_srv = serve_demo.start_servers(stack, {"target-only": (ServerSpec(str(target)), {})},
                                            work, pypath)["target-only"]
        for g in range(0, len(settings), args.together):
            group = {f"{st},{k},{nt}": (ServerSpec(str(target), draft, st, k, nt), {})
                     for st, k, nt in settings[g:g + args.together]}
            with contextlib.ExitStack() as inner:
                srv = serve_demo.start_servers(inner, group, work, pypath)
                got = serve_demo.measure({"target-only": base_srv, **srv}, args, work, dataset, n)
            base = got.pop("target-only")
            if runs:   # target-only's server info is the first group's
                base.pop("server_info", None)
            runs[f"target-only/{g // args.together}"] = base
            for name, run in got.items():
                runs[name] = run
                steps, topk, tokens = parse_setting(name)
                rows.append({"setting": name, "group": g // args.together, "num_steps": steps,
                             "topk": topk, "num_draft_tokens": tokens,
                             **serve_demo.versus(base["levels"]["1"]["report"],
                                                 run["levels"]["1"]["report"]),
                             "tok_s_target_only": round(base["levels"]["1"]["report"]["output_throughput"], 3)})
                r = rows[-1]
                print(f"{name:>8s}: acceptance {r['accept_length']} | {r['tok_s']:.2f} tok/s vs "
                      f"{r['tok_s_target_only']:.2f} | {r['speedup']:.2f}x | identical "
                      f"{r['outputs_identical']}", flush=True)
    best = max(rows, key=lambda r: r["speedup"])
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"summary": {"prompts": n, "new_tokens": args.new_tokens, "rows": rows, "best": best["setting"]},
              "draft": args.draft, "environment": environment(), "command": ["python", *sys.argv],
              "runs": runs}
    (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(out_dir / f"{args.name}.png", rows,
         f"{n} MT-Bench prompts x {args.new_tokens} tokens through real SGLang, fp32, this CPU")
    print(f"best: {best['setting']} ({best['speedup']:.2f}x); {out_dir / args.name}.json, .png")


if __name__ == "__main__":
    main()
