"""The served demo: real SGLang on this CPU, EAGLE-3 against target-only, SGLang's own client.

One after the other, on the same target (the bundled SmolLM2-135M-Instruct as a HF dir,
fp32) and the same MT-Bench first turns (never in any training data here):

  target-only   python -m sglang.launch_server --device cpu ...
  eagle3        the same with --speculative-algorithm EAGLE3 and DRAFT (this package's plugin)

each measured with ``python -m sglang.benchmark.serving --backend sglang --dataset-name custom
--apply-chat-template --max-concurrency C --temperature 0 --output-details`` (greedy; the
client ignores EOS by default, so every request runs its full length; outputs are compared
text for text).
Prints acceptance length (SGLang's), output tok/s of both, the speed-up and whether every
output is identical; writes NAME.json (machine, versions, git revision, commands, both
reports) and NAME.png under --output-dir.

    python benchmarks/serve_demo.py --draft DIR                  # 16 prompts x 64 tokens, concurrency 1
    python benchmarks/serve_demo.py --draft DIR --num-steps 3 --topk 4 --draft-tokens 8
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from eagle3_backend.cpu.launch import CpuServer, ServerSpec, entry_point_site  # noqa: E402


def write_dataset(path: Path, limit: int) -> int:
    """MT-Bench first turns as the custom JSONL SGLang's client reads (user turn + a placeholder)."""
    from eagle3_backend.verify.datasets import read_mtbench

    prompts = read_mtbench(limit=limit)
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"conversations": [{"role": "user", "content": p.messages[-1][1]},
                                                  {"role": "assistant", "content": "-"}]}) + "\n")
    return len(prompts)


def bench_command(url: str, target: Path, dataset: Path, n: int, tokens: int, concurrency: int,
                  out: Path) -> list[str]:
    return [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", url,
            "--model", str(target), "--tokenizer", str(target), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--num-prompts", str(n), "--sharegpt-output-len", str(tokens),
            "--apply-chat-template", "--max-concurrency", str(concurrency), "--seed", "0",
            "--temperature", "0",
            "--output-file", str(out), "--output-details", "--disable-tqdm"]


def run_one(name: str, spec: ServerSpec, args: argparse.Namespace, work: Path, dataset: Path, n: int,
            pypath: tuple[str, ...]) -> dict:
    out = work / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    with CpuServer(spec, work / f"{name}.log", pypath, start_timeout=900) as srv:
        cmd = bench_command(srv.url, Path(spec.target), dataset, n, args.new_tokens, args.concurrency, out)
        print(f"[{name}] {shlex.join(cmd[1:])}", flush=True)
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise SystemExit(f"[{name}] sglang.benchmark.serving failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        print(f"[{name}] done in {time.time() - t0:.0f} s", flush=True)
        return {"server_command": ["python", "-m", "sglang.launch_server", *spec.args(srv.port)],
                "bench_command": ["python", *cmd[1:]],
                "report": json.loads(out.read_text().strip().splitlines()[-1])}


def plot(path: Path, base: dict, spec: dict, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    vals = [base["output_throughput"], spec["output_throughput"]]
    bars = ax.bar(["target-only", "EAGLE-3"], vals, color=["#888888", "#2a7ab9"])
    for b, v in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom")
    ax.set_ylabel("output tok/s (SGLang's client)")
    ax.set_title(f"speed-up {summary['speedup']:.2f}x, acceptance {summary['accept_length']}, "
                 f"outputs identical: {summary['outputs_identical']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", required=True, help="the EAGLE-3 draft dir")
    ap.add_argument("--target", default=str(ROOT / "artifacts" / "smollm2-135m-instruct"),
                    help="HF dir (converted from the bundled GGUF when missing)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--output-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="serve-demo")
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "serve_demo"))
    args = ap.parse_args()

    from eagle3_backend.cpu.target_convert import convert_gguf_to_hf
    from eagle3_backend.verify.report import environment

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    target = convert_gguf_to_hf(args.target, dtype="float32")
    dataset = work / "mt-bench-first-turns.jsonl"
    n = write_dataset(dataset, args.prompts)
    pypath = (str(entry_point_site(ROOT / "pyproject.toml", work / "site")), str(ROOT))
    runs = {
        "target-only": run_one("target-only", ServerSpec(str(target)), args, work, dataset, n, pypath),
        "eagle3": run_one("eagle3", ServerSpec(str(target), str(Path(args.draft).resolve()), args.num_steps,
                                               args.topk, args.draft_tokens), args, work, dataset, n, pypath),
    }
    base, spec = runs["target-only"]["report"], runs["eagle3"]["report"]
    same = [a == b for a, b in zip(base["generated_texts"], spec["generated_texts"])]
    summary = {
        "prompts": n, "new_tokens": args.new_tokens, "concurrency": args.concurrency,
        "settings": {"num_steps": args.num_steps, "topk": args.topk, "num_draft_tokens": args.draft_tokens},
        "accept_length": round(spec["accept_length"], 3) if spec.get("accept_length") else None,
        "tok_s_target_only": round(base["output_throughput"], 3),
        "tok_s_eagle3": round(spec["output_throughput"], 3),
        "speedup": round(spec["output_throughput"] / base["output_throughput"], 3),
        "outputs_identical": f"{sum(same)}/{len(same)}",
    }
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"summary": summary, "draft": str(args.draft), "environment": environment(),
              "command": ["python", *sys.argv], "runs": runs}
    (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(out_dir / f"{args.name}.png", base, spec, summary)
    print(f"acceptance length {summary['accept_length']} (SGLang's) | tok/s target-only "
          f"{summary['tok_s_target_only']:.2f}, EAGLE-3 {summary['tok_s_eagle3']:.2f} | speed-up "
          f"{summary['speedup']:.2f}x | outputs identical {summary['outputs_identical']} | "
          f"{out_dir / args.name}.json, .png")


if __name__ == "__main__":
    main()
