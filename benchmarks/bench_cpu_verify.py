"""Benchmark: cost of one EAGLE-3 verify step vs one target-only decode step, real SGLang on CPU.

One run starts three servers on the same target (SmolLM2-135M-Instruct from
the bundled GGUF, fp32 unless --dtype bfloat16) and keeps them up:

  plain       target-only, SGLang defaults (what a user runs today; its
              scheduler overlaps the next batch's CPU work with the forward)
  plain-sync  target-only with --disable-overlap-schedule, the scheduling
              SGLang forces on every speculative server on CPU
  spec        EAGLE-3 chain, --speculative-num-steps 3 --speculative-eagle-topk 1
              --speculative-num-draft-tokens 4, with a random draft (SGLang's
              default layout) whose proposals are almost never accepted, so
              every step is one full draft + 4-token verify that commits one token

Requests are streamed (greedy), and the servers are queried in rotation,
prompt by prompt, so all see the same background load. A step's cost is the
gap between consecutive streamed chunks: one chunk per decode step (plain) or
per draft+verify step (spec). Reported: median step ms of each, the ratios
spec/plain and spec/plain-sync (issue target: <= 1.4), and plain
transformers' greedy decode ms/token on the same model, dtype and threads,
measured in this process between the rounds (issue target: SGLang plain
tok/s >= 0.8x of it).

    python benchmarks/bench_cpu_verify.py                    # fp32, 8 prompts x 64 tokens
    python benchmarks/bench_cpu_verify.py --dtype bfloat16 --prompts 4 --new-tokens 32

Appends one row to benchmarks/results/bench_cpu_verify.csv (machine, load,
command, the EAGLE3_CPU_* switches the servers inherited, numbers). An A/B is two runs back
to back, e.g. with and without ``EAGLE3_CPU_LAYER_OPS=0`` in the environment.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import time
import urllib.request
from pathlib import Path

# Same OpenMP wait policy as the servers get from the CPU platform (eagle3_backend.cpu.entry),
# so that the in-process transformers baseline is measured under the same rules.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "0")

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests" / "cpu"):
    if str(p) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(p))

from eagle3_backend.cpu.launch import CpuServer, ServerSpec, entry_point_site  # noqa: E402
from eagle3_backend.cpu.target_convert import convert_gguf_to_hf  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def stream_step_times(server: CpuServer, input_ids: list[int], new_tokens: int,
                      timeout: float = 600.0) -> tuple[list[float], dict]:
    """Stream one greedy request; return the gaps (s) between consecutive chunks and the last meta."""
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    req = urllib.request.Request(server.url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    stamps, meta = [], {}
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            stamps.append(time.perf_counter())
            meta = json.loads(line[5:])["meta_info"]
    return [b - a for a, b in zip(stamps, stamps[1:])], meta


def transformers_ms_per_token(target: Path, dtype: str, input_ids: list[int], new_tokens: int) -> float:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=getattr(torch, dtype))
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return (time.perf_counter() - t0) / new_tokens * 1000


def _git_rev() -> str:
    import subprocess

    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "artifacts" / "smollm2-135m-instruct"),
                    help="HF dir (converted from the bundled GGUF when missing)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=8, help="MT-Bench prompts (first turns)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "bench_cpu_verify"))
    ap.add_argument("--no-packed-linear", action="store_true",
                    help="serve with EAGLE3_CPU_PACKED_LINEAR=0 (plain F.linear)")
    args = ap.parse_args()

    import transformers

    from cpu_drafts import make_random_draft
    from eagle3_backend.verify.datasets import read_mtbench, render_prompt

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    target = convert_gguf_to_hf(args.target, dtype="float32")
    draft = make_random_draft(work / "random-draft", target)
    tok = transformers.AutoTokenizer.from_pretrained(str(target))
    prompts = [render_prompt(tok, p) for p in read_mtbench(limit=args.prompts)]
    env = {"EAGLE3_CPU_PACKED_LINEAR": "0" if args.no_packed_linear else "1"}
    pypath = (str(entry_point_site(ROOT / "pyproject.toml", work / "site")), str(ROOT))
    servers = {
        "plain": CpuServer(ServerSpec(str(target), dtype=args.dtype), work / "plain.log", pypath,
                           env_extra=env),
        "plain-sync": CpuServer(ServerSpec(str(target), dtype=args.dtype,
                                           extra_args=("--disable-overlap-schedule",)),
                                work / "plain_sync.log", pypath, env_extra=env),
        "spec": CpuServer(ServerSpec(str(target), str(draft), 3, 1, 4, dtype=args.dtype),
                          work / "spec.log", pypath, env_extra=env),
    }
    gaps: dict[str, list[float]] = {name: [] for name in servers}
    accept, hf = [], []
    with servers["plain"], servers["plain-sync"], servers["spec"]:
        for srv in servers.values():   # warm-up: first requests compile/allocate
            stream_step_times(srv, prompts[0], 8)
        for i, ids in enumerate(prompts):
            for name, srv in servers.items():
                step_gaps, meta = stream_step_times(srv, ids, args.new_tokens)
                gaps[name] += step_gaps
            accept.append(float(meta.get("spec_accept_length", float("nan"))))
            if i % 4 == 0:
                hf.append(transformers_ms_per_token(target, args.dtype, ids, min(32, args.new_tokens)))
            print(f"prompt {i}: " + ", ".join(f"{n} {statistics.median(g) * 1e3:.1f} ms"
                                             for n, g in gaps.items()), flush=True)
    d_ms, v_ms = statistics.median(gaps["plain"]) * 1e3, statistics.median(gaps["spec"]) * 1e3
    ds_ms = statistics.median(gaps["plain-sync"]) * 1e3
    hf_ms = statistics.median(hf)
    row = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()} {os.cpu_count()} cpus",
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "command": shlex.join([sys.executable, *sys.argv]),
        "git_rev": _git_rev(),
        "dtype": args.dtype, "packed_linear": not args.no_packed_linear,
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "unset"),
        # the CPU engine's switches the servers inherited (EAGLE3_CPU_LAYER_OPS=0, ...)
        "cpu_env": " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                            if k.startswith("EAGLE3_CPU_")) or "defaults",
        "prompts": args.prompts, "new_tokens": args.new_tokens,
        "decode_ms": round(d_ms, 2), "decode_sync_ms": round(ds_ms, 2), "verify_ms": round(v_ms, 2),
        "verify_over_decode": round(v_ms / d_ms, 3), "verify_over_decode_sync": round(v_ms / ds_ms, 3),
        "spec_accept_length": round(statistics.mean(accept), 3),
        "transformers_ms_per_token": round(hf_ms, 2),
        "sglang_over_transformers_tok_s": round(hf_ms / d_ms, 3),
    }
    print(json.dumps(row, indent=2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_cpu_verify.csv"
    rows = list(csv.DictReader(out.open(newline=""))) if out.exists() else []
    fields = list(rows[0]) if rows else []
    fields += [k for k in row if k not in fields]   # a new column: older rows leave it empty
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows([*rows, row])
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
