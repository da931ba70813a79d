"""Greedy outputs of an EAGLE-3 CPU server vs the target-only server, prompt by prompt.

    python scripts/cpu_compare_outputs.py --dtype bfloat16 --prompts 8 --new-tokens 128
    python scripts/cpu_compare_outputs.py --draft artifacts/my-draft --topk 4 --num-draft-tokens 8

Starts a target-only and a speculative server (SmolLM2-135M-Instruct converted
from the bundled GGUF unless --target is given; a random demo draft unless
--draft is given), sends the first turns of MT-Bench to each, and prints per
prompt whether the token ids agree and where they first diverge, plus
SGLang's spec_accept_length. In fp32 they must agree (the CI tier asserts
it); in bf16 a 4-token verify pass rounds differently from a 1-token decode,
so this reports how far they agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests" / "cpu"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "artifacts" / "smollm2-135m-instruct"))
    ap.add_argument("--draft", default=None, help="draft dir (default: a random demo draft)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "cpu_compare"))
    args = ap.parse_args()

    import transformers

    from cpu_drafts import make_random_draft
    from eagle3_backend.cpu.launch import CpuServer, ServerSpec, entry_point_site
    from eagle3_backend.cpu.target_convert import convert_gguf_to_hf
    from eagle3_backend.verify.datasets import read_mtbench, render_prompt

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    target = convert_gguf_to_hf(args.target)
    draft = Path(args.draft) if args.draft else make_random_draft(work / "random-draft", target)
    tok = transformers.AutoTokenizer.from_pretrained(str(target))
    prompts = read_mtbench(limit=args.prompts)
    pypath = (str(entry_point_site(ROOT / "pyproject.toml", work / "site")), str(ROOT))
    plain = CpuServer(ServerSpec(str(target), dtype=args.dtype), work / "plain.log", pypath)
    spec = CpuServer(ServerSpec(str(target), str(draft), args.steps, args.topk, args.num_draft_tokens,
                                dtype=args.dtype), work / "spec.log", pypath)
    rows = []
    with plain, spec:
        for p in prompts:
            ids = render_prompt(tok, p)
            a = plain.generate(ids, args.new_tokens)["output_ids"]
            out = spec.generate(ids, args.new_tokens)
            b = out["output_ids"]
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                         None if len(a) == len(b) else min(len(a), len(b)))
            rows.append({"id": p.id, "identical": first is None, "first_difference": first,
                         "tokens": len(a), "spec_accept_length": out["meta_info"].get("spec_accept_length")})
            print(json.dumps(rows[-1]), flush=True)
    same = sum(r["identical"] for r in rows)
    print(f"{args.dtype}: {same} of {len(rows)} prompts identical; mean accept length "
          f"{statistics.mean(r['spec_accept_length'] for r in rows):.3f}")


if __name__ == "__main__":
    main()
