"""Benchmark: verify_tree_greedy on SGLang-shaped draft trees, every backend.

Random trees of D nodes per request (each node's parent drawn among the earlier
nodes, so first-child / next-sibling links are in ascending node order as SGLang
builds them), the target agreeing with the draft on a random path. Every
backend's outputs are checked equal to ``torch`` (the reference) before it is
timed; reported: median microseconds per call for each batch size B. Uses the
timing and environment helpers of bench_capture_into.py; writes
benchmarks/results/verify_tree_<gpu>.csv.

GPU:   python benchmarks/bench_verify_tree.py
CPU smoke (tests): TRITON_INTERPRET=1 python benchmarks/bench_verify_tree.py --device cpu --b 1 4 --rep 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(p))

from bench_capture_into import (  # noqa: E402
    available_providers,
    environment,
    modes_for,
    parse_common,
    time_ms,
    write_csv,
)

from eagle3_backend.ops import allocate_verify_outputs, verify_tree_greedy  # noqa: E402

PROVIDERS = ("torch", "triton", "cuda")
GRAPH_SAFE = ("triton", "cuda")  # the torch reference walks the tree on the host (.tolist())


def random_trees(batch: int, num_draft: int, vocab: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """SGLang's tree tensors [B, D] (int64), node 0 the root."""
    cand = torch.randint(vocab, (batch, num_draft), generator=generator)
    first = torch.full((batch, num_draft), -1, dtype=torch.long)
    sibling = torch.full((batch, num_draft), -1, dtype=torch.long)
    target = torch.randint(vocab, (batch, num_draft), generator=generator)
    for b in range(batch):
        last_child: dict[int, int] = {}
        for node in range(1, num_draft):
            parent = int(torch.randint(node, (1,), generator=generator))
            if parent in last_child:
                sibling[b, last_child[parent]] = node
            else:
                first[b, parent] = node
            last_child[parent] = node
            if last_child[parent] == first[b, parent]:  # the target follows the first child
                target[b, parent] = cand[b, node]
    rows = torch.arange(batch * num_draft).view(batch, num_draft)
    return {"candidates": cand, "retrieve_index": rows, "retrieve_next_token": first,
            "retrieve_next_sibling": sibling, "target_predict": target}


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    device = torch.device(args.device)
    providers, skipped = available_providers(args.providers, device, jit=not args.no_jit)
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", file=sys.stderr)
    env = environment(device, args.argv, "bench_verify_tree.py")
    generator = torch.Generator().manual_seed(0)
    rows = []
    modes = modes_for(device, args.modes)
    for batch in args.b:                              # one tree and reference for every mode
        tree = {k: v.to(device) for k, v in random_trees(batch, args.d, args.vocab, generator).items()}

        def fresh() -> list[torch.Tensor]:
            return list(allocate_verify_outputs(batch, args.d, args.depth + 1, device))

        reference = fresh()
        verify_tree_greedy(*reference, **tree, backend="torch")
        expected = [t.cpu() for t in reference]

        def same(outs: list[torch.Tensor]) -> bool:
            return all(torch.equal(a.cpu(), b) for a, b in zip(outs, expected))

        for name in providers:
            out = fresh()

            def call() -> list[torch.Tensor]:
                verify_tree_greedy(*out, **tree, backend=name)
                return out

            if not same(call()):
                raise SystemExit(f"{name} differs from torch at B={batch}: refusing to time a wrong kernel")
            for mode in modes:
                if mode == "graph" and name not in GRAPH_SAFE:
                    print(f"{mode} B={batch:>5} {name}: not timed (reads the tree on the host)")
                    continue
                for t, fill in zip(out, fresh()):
                    t.copy_(fill)                     # so the check below sees what the timed calls wrote
                ms, result = time_ms(call, device, args.warmup, args.rep, mode)
                if not same(result):
                    raise SystemExit(f"{name} differs from torch at B={batch} in {mode} mode")
                rows.append({"mode": mode, "provider": name, "B": batch, "D": args.d, "S": args.depth + 1,
                             "time_us": round(ms * 1e3, 3)})
                print(f"{mode:<5} B={batch:>5} D={args.d} {name:<8} {ms * 1e3:>10.2f} us")
    rows.sort(key=lambda r: modes.index(r["mode"]))   # the file: one mode after the other
    write_csv(rows, env, Path(args.out_dir), "verify_tree", args.tag)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--b", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--d", type=int, default=8, help="draft tokens per request, the root included")
    parser.add_argument("--depth", type=int, default=3, help="draft steps (max accepted tokens)")
    parser.add_argument("--vocab", type=int, default=4, help="token range: small, so paths get accepted")
    return parse_common(parser, PROVIDERS, argv)


if __name__ == "__main__":
    run(parse_args())
