"""Where a served step's time goes on this CPU: py-spy samples of SGLang's scheduler.

A target-only server and an EAGLE-3 server (the same target, fp32, one thread each) start
together and answer the same greedy request in a loop, one server at a time, while ``py-spy
record --nonblocking`` samples its scheduler process for ``--seconds``. The samples of the
scheduler's main thread are sorted into phases by the frames they hold (first match wins,
``PHASES``) and into the ops inside the forwards (``OPS``); with the measured tok/s and
SGLang's acceptance length the shares turn into milliseconds a step. ``--concurrency N``
keeps N requests in flight; ``--stock`` also profiles the EAGLE-3 server with stock SGLang's
capture (no eagle3 plugin), to find what the plugin costs. Writes NAME.json (machine,
versions, git revision, commands, phases, ops) under --output-dir.

    pip install py-spy   # not a dependency of the package
    python benchmarks/profile_serve.py --draft DIR
    python benchmarks/profile_serve.py --draft DIR --concurrency 4 --stock
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "benchmarks")) if p not in sys.path]

import serve_demo  # noqa: E402

from eagle3_backend.cpu.launch import STOCK_CAPTURE_ENV, ServerSpec  # noqa: E402

MAIN = "Scheduler.run_event_loop"          # frames of the scheduler's main thread
PHASES = (("verify forward", "run_eagle_verify"), ("draft steps", "EagleDraftWorker.draft "),
          ("draft extend", "_draft_extend_for_decode"), ("decode forward", "_execute_decode"),
          ("prefill", "_forward_prefill_batch"), ("prefill", "_execute_extend"))
OPS = (("lm_head", "LogitsProcessor.forward"), ("linear layers", "packed_linear"),
       ("attention", "RadixAttention.forward"))


def shares(raw: str) -> tuple[int, Counter, Counter]:
    """(main-thread samples, samples by phase, samples by (phase, op)) of py-spy's raw output
    (one ``frame;frame;... COUNT`` line per stack)."""
    total, phase, op = 0, Counter(), Counter()
    for line in raw.splitlines():
        if MAIN not in line:
            continue
        stack, n = line.rsplit(" ", 1)
        total += int(n)
        ph = next((name for name, frame in PHASES if frame in stack), "other")
        phase[ph] += int(n)
        op[ph, next((name for name, frame in OPS if frame in stack), "other")] += int(n)
    return total, phase, op


def profile(srv, ids: list[int], tokens: int, seconds: float, out: Path, concurrency: int = 1) -> dict:
    """``concurrency`` clients send requests in a loop while py-spy samples the scheduler;
    tok/s, acceptance, shares. A step makes ``accept_length`` tokens for each of the
    ``concurrency`` requests in the batch."""
    serve_demo.warm_batch_sizes(srv, ids, concurrency)
    pids = subprocess.run(["pgrep", "-g", str(srv.proc.pid)], capture_output=True,
                          text=True).stdout.split()
    sched = next(p for p in pids if "scheduler" in Path(f"/proc/{p}/cmdline").read_text())
    done: list[dict] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            meta = srv.generate(ids, tokens)["meta_info"]
            done.append({"seconds": time.perf_counter() - t0, "tokens": meta["completion_tokens"],
                         "accept_length": meta.get("spec_accept_length")})

    threads = [threading.Thread(target=load, daemon=True) for _ in range(concurrency)]
    for th in threads:
        th.start()
    time.sleep(2)
    subprocess.run(["py-spy", "record", "-p", sched, "-d", str(int(seconds)), "-r", "100",
                    "--nonblocking", "-f", "raw", "-o", str(out)], check=True,
                   capture_output=True)
    stop.set()
    for th in threads:
        th.join()
    total, phase, op = shares(out.read_text())
    tok_s = concurrency * sum(d["tokens"] for d in done) / sum(d["seconds"] for d in done)
    acc = [d["accept_length"] for d in done if d["accept_length"] is not None]
    accept = sum(acc) / len(acc) if acc else 1.0
    step_ms = 1000.0 * accept * concurrency / tok_s                         # one forward step
    return {"requests": len(done), "tok_s": round(tok_s, 3), "accept_length": round(accept, 3),
            "step_ms": round(step_ms, 2), "samples": total,
            "phases_ms": {k: round(step_ms * v / total, 2) for k, v in phase.most_common()},
            "ops_ms": {f"{p} / {o}": round(step_ms * v / total, 2) for (p, o), v in op.most_common()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", default=str(ROOT / "artifacts" / "smollm2-135m-instruct"))
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=2)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--draft-tokens", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=1,
                    help="clients sending requests at once (default 1)")
    ap.add_argument("--stock", action="store_true",
                    help="also profile the EAGLE-3 server with stock SGLang's capture "
                         "(SGLANG_PLUGINS=eagle3_cpu, no eagle3 plugin): what the plugin costs")
    ap.add_argument("--output-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="profile-serve")
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "profile_serve"))
    args = ap.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not on PATH; install it (pip install py-spy) and rerun.")
    from eagle3_backend.verify.report import environment

    args.prompts = 1
    work, target, _, _, pypath = serve_demo.prepare(args)
    ids = serve_demo.first_prompt_ids(target)
    eagle = ServerSpec(str(target), str(Path(args.draft).resolve()), args.num_steps, args.topk,
                       args.draft_tokens)
    specs = {"target-only": (ServerSpec(str(target)), {"OMP_NUM_THREADS": "1"}),
             "eagle3": (eagle, {"OMP_NUM_THREADS": "1"})}
    if args.stock:   # the CPU platform only: stock SGLang's own capture (as serve_demo.py --stock)
        specs["stock"] = (eagle, {"OMP_NUM_THREADS": "1", **STOCK_CAPTURE_ENV})
    result = {}
    with contextlib.ExitStack() as stack:
        servers = serve_demo.start_servers(stack, specs, work, pypath)
        for name, srv in servers.items():      # one at a time: the other server idles
            result[name] = {"server_command": ["python", "-m", "sglang.launch_server",
                                               *srv.spec.args(srv.port)],
                            **profile(srv, ids, args.new_tokens, args.seconds,
                                      work / f"{name}.pyspy.txt", args.concurrency)}
            print(f"[{name}] {json.dumps(result[name]['phases_ms'])}", flush=True)
        if args.stock:
            serve_demo.check_stock_split(servers["eagle3"].plugin_active(),
                                         servers["stock"].plugin_active(), work)
    base, spec = result["target-only"], result["eagle3"]
    result["step_over_decode"] = round(spec["step_ms"] / base["step_ms"], 3)
    if "stock" in result:
        result["plugin_step_over_stock"] = round(spec["step_ms"] / result["stock"]["step_ms"], 3)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(
        {"result": result, "draft": args.draft, "new_tokens": args.new_tokens,
         "concurrency": args.concurrency,
         "seconds": args.seconds, "environment": environment(),
         "command": ["python", *sys.argv]}, indent=1) + "\n")
    print(f"a speculative step costs {result['step_over_decode']}x a decode step "
          f"({spec['step_ms']} vs {base['step_ms']} ms; acceptance {spec['accept_length']}); "
          f"{out / args.name}.json")


if __name__ == "__main__":
    main()
