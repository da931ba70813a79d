"""The served demo: real SGLang on this CPU, EAGLE-3 against target-only, SGLang's own client.

All up at once and measured in rotation (every server in turn on each chunk of --chunk
prompts, --rounds times: a slow minute on this shared machine falls on all of them), on the
same target (the bundled SmolLM2-135M-Instruct as a HF dir, fp32) and the same MT-Bench
first turns (never in any training data here):

  target-only   python -m sglang.launch_server --device cpu ...
  eagle3        the same with --speculative-algorithm EAGLE3 and DRAFT (this package's plugin)
  stock         (--stock) the same EAGLE-3 server with SGLANG_PLUGINS=eagle3_cpu: the CPU
                platform only, stock SGLang's own capture of the ids in DRAFT's config
                (a layout stock SGLang can express): what the plugin costs
  target-only-sync  (--sync-baseline) target-only with --disable-overlap-schedule, the
                scheduling every speculative server runs on CPU and the faster target-only
                server on this one: the speed-up against the best baseline

each measured at every --concurrency level with ``python -m sglang.benchmark.serving
--backend sglang --dataset-name custom --apply-chat-template --max-concurrency C
--temperature 0 --output-details`` (greedy; the client ignores EOS by default, so every
request runs its full length; outputs are compared text for text with target-only's).
Prints per level acceptance length (SGLang's), output tok/s of each server, the speed-up,
the plugin's tok/s over stock's and whether every output is identical; writes NAME.json
(machine, versions, git revision, commands, every report) and NAME.png under --output-dir.

    python benchmarks/serve_demo.py --draft DIR                  # 16 prompts x 64 tokens, concurrency 1
    python benchmarks/serve_demo.py --draft DIR --concurrency 1 4 --stock
    python benchmarks/serve_demo.py --draft DIR --num-steps 3 --topk 4 --draft-tokens 8
"""

from __future__ import annotations

import argparse
import contextlib
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

from eagle3_backend.cpu.launch import STOCK_CAPTURE_ENV, CpuServer, ServerSpec, entry_point_site  # noqa: E402


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
            "--warmup-requests", str(concurrency),   # the batch shape warmed before it is timed
            "--temperature", "0",
            "--output-file", str(out), "--output-details", "--disable-tqdm"]


def prepare(args: argparse.Namespace) -> tuple[Path, Path, Path, int, tuple[str, ...]]:
    """(work dir, fp32 target dir, MT-Bench dataset file, its prompt count, the servers'
    PYTHONPATH with this checkout's entry points) from --workdir, --target and --prompts."""
    from eagle3_backend.cpu.target_convert import convert_gguf_to_hf

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    target = convert_gguf_to_hf(args.target, dtype="float32")
    dataset = work / "mt-bench-first-turns.jsonl"
    n = write_dataset(dataset, args.prompts)
    return work, target, dataset, n, (str(entry_point_site(ROOT / "pyproject.toml", work / "site")), str(ROOT))


def start_servers(stack: contextlib.ExitStack, specs: dict[str, tuple[ServerSpec, dict[str, str]]],
                  work: Path, pypath: tuple[str, ...]) -> dict[str, CpuServer]:
    """Every server of ``specs`` (name -> (spec, extra env)) started and kept up in ``stack``."""
    out = {}
    for name, (spec, env) in specs.items():
        out[name] = stack.enter_context(CpuServer(spec, work / f"{name}.log", pypath,
                                                  start_timeout=900, env_extra=env))
        print(f"[{name}] up at {out[name].url}", flush=True)
    return out


def warm_batch_sizes(srv: CpuServer, ids: list[int], concurrency: int) -> None:
    """``concurrency`` greedy requests at once, of different lengths, so the server runs every
    batch size from ``concurrency`` down to 1 before anything is timed. SGLang's EAGLE draft
    step calls a torch.compile'd function (``select_top_k_tokens``) that compiles again the
    first time a batch of more than one request reaches it: seconds, and in a timed run it
    lands on whichever server sees that batch first (the next one finds inductor's on-disk
    cache). SGLang's client warms with requests that all end together."""
    import threading

    threads = [threading.Thread(target=srv.generate, args=(ids, 8 * (j + 1)))
               for j in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def check_stock_split(plugin_on: bool, stock_on: bool, work: Path) -> None:
    """Stop unless the plugin ran in the eagle3 server and not in the stock one."""
    if stock_on or not plugin_on:
        raise SystemExit("the stock server ran the eagle3 plugin, or the plugin server did not: "
                         f"see {work}/stock.log and {work}/eagle3.log")


def first_prompt_ids(target: Path) -> list[int]:
    """The first MT-Bench first turn through the target's chat template (warm-up requests)."""
    from transformers import AutoTokenizer

    from eagle3_backend.verify.datasets import read_mtbench, render_prompt

    return render_prompt(AutoTokenizer.from_pretrained(target), read_mtbench()[0])


def measure(servers: dict[str, CpuServer], args: argparse.Namespace, work: Path, dataset: Path,
            n: int) -> dict:
    """SGLang's client against every server at every level, --rounds times in rotation (the
    servers idle between their turns), so drift on a shared machine hits all of them alike.
    Within a round the prompts go in chunks of ``--chunk`` (at least the concurrency level),
    each chunk to every server in turn: the servers take turns every few seconds, not once
    per round, so a slow minute on this machine falls on all of them.

    Per server and level: the rounds' reports (a round's chunks joined), and one combined
    report (output tok/s = all output tokens over all the client's seconds; texts of round 1,
    with whether every round gave the same texts; SGLang's acceptance after the last round)."""
    runs: dict = {name: {"server_command": ["python", "-m", "sglang.launch_server",
                                            *srv.spec.args(srv.port)],
                         "server_env": dict(srv.env_extra),
                         "plugin_active": srv.plugin_active(),
                         "levels": {str(c): {"rounds": []} for c in args.concurrency}}
                  for name, srv in servers.items()}
    lines = dataset.read_text().splitlines(keepends=True)
    ids = first_prompt_ids(Path(next(iter(servers.values())).spec.target))
    for srv in servers.values():
        for c in args.concurrency:
            warm_batch_sizes(srv, ids, c)
    for r in range(args.rounds):
        for c in args.concurrency:
            size = max(args.chunk, c)
            parts: dict[str, list[dict]] = {name: [] for name in servers}
            seconds = {name: 0.0 for name in servers}
            for k in range(0, n, size):
                part = work / f"{dataset.stem}-{k}-{k + size}.jsonl"
                part.write_text("".join(lines[k:k + size]))
                m = min(size, n - k)
                for name, srv in servers.items():
                    path = work / f"{name}-c{c}-r{r}-{k}.jsonl"
                    path.unlink(missing_ok=True)
                    cmd = bench_command(srv.url, Path(srv.spec.target), part, m, args.new_tokens, c, path)
                    t = time.time()
                    proc = subprocess.run(cmd, capture_output=True, text=True,
                                          env={**os.environ, "OMP_NUM_THREADS": "1"})
                    if proc.returncode != 0:
                        raise SystemExit(f"[{name}] sglang.benchmark.serving failed ({proc.returncode}):\n"
                                         f"{proc.stderr[-3000:]}")
                    parts[name].append(slim(json.loads(path.read_text().strip().splitlines()[-1]), runs[name]))
                    runs[name]["levels"][str(c)]["bench_command"] = ["python", *cmd[1:]]
                    seconds[name] += time.time() - t
            for name in servers:
                rep = join_chunks(parts[name])
                runs[name]["levels"][str(c)]["rounds"].append(rep)
                print(f"[{name} c={c} round {r + 1}/{args.rounds}] {rep['output_throughput']:.2f} tok/s "
                      f"in {seconds[name]:.0f} s", flush=True)
    for run in runs.values():
        for lv in run["levels"].values():
            lv["report"] = combine(lv["rounds"])
    return runs


def join_chunks(reps: list[dict]) -> dict:
    """One round's report from its chunks' reports, in prompt order: counts and seconds
    summed, per-request lists (texts, lengths, TTFTs) concatenated, throughputs recomputed;
    SGLang's server-wide acceptance is cumulative, so the last chunk's covers the round.
    Latency statistics do not add up: each chunk's stay under ``per_chunk``."""
    if len(reps) == 1:
        return reps[0]
    out: dict = {}
    for key, first in reps[0].items():
        if key.endswith("_ms") or key.endswith("_throughput") or key == "max_output_tokens_per_s":
            continue
        if isinstance(first, list):
            out[key] = [v for x in reps for v in x[key]]
        elif key == "completed" or key == "duration" or key.startswith("total_"):
            out[key] = sum(x[key] for x in reps)
        else:
            out[key] = first
    for key, count in (("output_throughput", "total_output_tokens"), ("input_throughput", "total_input_tokens"),
                       ("request_throughput", "completed")):
        out[key] = out[count] / out["duration"]
    out["accept_length"] = reps[-1].get("accept_length")
    out["per_chunk"] = [{k: v for k, v in x.items() if k.endswith("_ms") or k == "output_throughput"}
                        for x in reps]
    return out


def slim(rep: dict, run: dict) -> dict:
    """The client's report without its bulk: SGLang's server info is kept once per server
    (``run["server_info"]``), per-token latencies as the report's own percentiles only."""
    info = rep.pop("server_info", None)
    if info is not None:
        run.setdefault("server_info", info)
    rep.pop("itls", None)
    return rep


def combine(reps: list[dict]) -> dict:
    """One report of several client runs: all output tokens over all their seconds; the first
    run's texts, and whether every run gave the same texts; the last run's acceptance. SGLang's
    is server-wide since start (warm-up included), added up every 40 decode steps, so the last
    reading covers every run and the first only a share of them."""
    return {"output_throughput": sum(x["total_output_tokens"] for x in reps) / sum(x["duration"] for x in reps),
            "generated_texts": reps[0]["generated_texts"], "accept_length": reps[-1].get("accept_length"),
            "rounds_identical": all(x["generated_texts"] == reps[0]["generated_texts"] for x in reps)}


def versus(base: dict, rep: dict) -> dict:
    """A speculative server's combined report against target-only's: SGLang's acceptance,
    tok/s, speed-up and how many outputs are identical."""
    same = [a == b for a, b in zip(base["generated_texts"], rep["generated_texts"])]
    return {"accept_length": round(rep["accept_length"], 3) if rep.get("accept_length") else None,
            "tok_s": round(rep["output_throughput"], 3),
            "speedup": round(rep["output_throughput"] / base["output_throughput"], 3),
            "outputs_identical": f"{sum(same)}/{len(same)}"}


def summarize(runs: dict, n: int) -> dict:
    """Per concurrency level: acceptance, tok/s of each server, speed-up, plugin / stock, identical."""
    levels = {}
    for c, lv in runs["target-only"]["levels"].items():
        base = lv["report"]
        row: dict = {"tok_s_target_only": round(base["output_throughput"], 3)}
        if "target-only-sync" in runs:
            sync = runs["target-only-sync"]["levels"][c]["report"]["output_throughput"]
            row["tok_s_target_only_sync"] = round(sync, 3)
            row["speedup_eagle3_over_sync"] = round(
                runs["eagle3"]["levels"][c]["report"]["output_throughput"] / sync, 3)
        for name in ("eagle3", "stock"):
            if name in runs:
                row.update({f"{k}_{name}": v for k, v in versus(base, runs[name]["levels"][c]["report"]).items()})
        if "stock" in runs:
            row["plugin_over_stock"] = round(row["tok_s_eagle3"] / row["tok_s_stock"], 3)
            a = runs["eagle3"]["levels"][c]["report"]["generated_texts"]
            b = runs["stock"]["levels"][c]["report"]["generated_texts"]
            row["plugin_stock_identical"] = f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"
        levels[c] = row
    return {"prompts": n, "levels": levels}


def plot(path: Path, summary: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(summary["levels"])
    names = [k for k in ("target_only", "target_only_sync", "eagle3", "stock")
             if f"tok_s_{k}" in summary["levels"][levels[0]]]
    colors = {"target_only": "#888888", "target_only_sync": "#bbbbbb", "eagle3": "#2a7ab9",
              "stock": "#e08a2c"}
    labels = {"target_only": "target-only", "target_only_sync": "target-only, no overlap",
              "eagle3": "EAGLE-3 (plugin)", "stock": "EAGLE-3 (stock capture)"}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    w = 0.8 / len(names)
    for i, k in enumerate(names):
        vals = [summary["levels"][c][f"tok_s_{k}"] for c in levels]
        xs = [j + (i - (len(names) - 1) / 2) * w for j in range(len(levels))]
        bars = ax.bar(xs, vals, w, color=colors[k], label=labels[k])
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(levels)), [f"concurrency {c}\n{summary['levels'][c]['speedup_eagle3']:.2f}x" for c in levels])
    ax.set_ylabel("output tok/s (SGLang's client)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
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
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1],
                    help="client --max-concurrency levels, each on the same servers (default 1)")
    ap.add_argument("--stock", action="store_true",
                    help="also serve DRAFT with stock SGLang's capture (no eagle3 plugin)")
    ap.add_argument("--sync-baseline", action="store_true",
                    help="also serve target-only with --disable-overlap-schedule")
    ap.add_argument("--rounds", type=int, default=2,
                    help="client runs per server and level, in rotation across the servers (default 2)")
    ap.add_argument("--chunk", type=int, default=4,
                    help="prompts per client run within a round, every server in turn (default 4)")
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--output-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="serve-demo")
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "serve_demo"))
    args = ap.parse_args()

    from eagle3_backend.verify.report import environment

    work, target, dataset, n, pypath = prepare(args)
    draft = str(Path(args.draft).resolve())
    eagle = ServerSpec(str(target), draft, args.num_steps, args.topk, args.draft_tokens)
    specs = {"target-only": (ServerSpec(str(target)), {}), "eagle3": (eagle, {})}
    if args.stock:   # the CPU platform only: stock SGLang's own capture, no eagle3 plugin
        specs["stock"] = (eagle, dict(STOCK_CAPTURE_ENV))
    if args.sync_baseline:
        specs["target-only-sync"] = (ServerSpec(str(target),
                                                extra_args=("--disable-overlap-schedule",)), {})
    with contextlib.ExitStack() as stack:
        runs = measure(start_servers(stack, specs, work, pypath), args, work, dataset, n)
    if args.stock:
        check_stock_split(runs["eagle3"]["plugin_active"], runs["stock"]["plugin_active"], work)
    summary = {**summarize(runs, n), "new_tokens": args.new_tokens,
               "settings": {"num_steps": args.num_steps, "topk": args.topk,
                            "num_draft_tokens": args.draft_tokens}}
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"summary": summary, "draft": str(args.draft), "environment": environment(),
              "command": ["python", *sys.argv], "runs": runs}
    (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(out_dir / f"{args.name}.png", summary,
         f"{n} MT-Bench prompts x {args.new_tokens} tokens, chain/tree {args.num_steps}/{args.topk}/"
         f"{args.draft_tokens}, fp32, this CPU")
    for c, row in summary["levels"].items():
        line = (f"concurrency {c}: acceptance length {row['accept_length_eagle3']} (SGLang's) | tok/s "
                f"target-only {row['tok_s_target_only']:.2f}, EAGLE-3 {row['tok_s_eagle3']:.2f} | "
                f"speed-up {row['speedup_eagle3']:.2f}x | outputs identical {row['outputs_identical_eagle3']}")
        if "speedup_eagle3_over_sync" in row:
            line += (f" | target-only without overlap {row['tok_s_target_only_sync']:.2f} tok/s: "
                     f"speed-up over it {row['speedup_eagle3_over_sync']:.2f}x")
        if "plugin_over_stock" in row:
            line += (f" | stock capture {row['tok_s_stock']:.2f} tok/s: plugin / stock "
                     f"{row['plugin_over_stock']:.3f}, outputs identical {row['plugin_stock_identical']}")
        print(line)
    print(f"{out_dir / args.name}.json, .png")

if __name__ == "__main__":
    main()
