"""Record `eagle3 doctor --url` against real CPU SGLang servers (benchmarks/results/doctor-serve-*).

Two launches of SmolLM2-135M-Instruct (fp32, chain of 3 steps) with a trained draft:

* ``stock``: SGLang without this package's serving plugin (SGLANG_PLUGINS keeps only
  the CPU platform), serving DRAFT as written by ``eagle3 train``: does stock SGLang's
  reading of the stored eagle_config ids feed the draft what it was trained on?
* ``stale``: with the plugin, serving a copy of DRAFT whose fc slots are relabelled
  (``eagle3 convert --layout``), as a deployment pointed at a stale checkpoint does;
  the doctor is run on DRAFT, the draft the server was meant to serve.

    python benchmarks/doctor_serve_cpu.py --draft ~/.cache/eagle3-backend/drafts/smollm2-<key> \
        --limit 16 --max-new-tokens 48

Each scenario writes ``doctor-serve-<scenario>.json`` (the doctor's --json report,
plus machine, versions and command) and ``.png`` (its --plot) under --out-dir.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3_backend.cli import main as eagle3  # noqa: E402
from eagle3_backend.cpu.launch import STOCK_CAPTURE_ENV, CpuServer, ServerSpec, entry_point_site  # noqa: E402
from eagle3_backend.cpu.target_convert import convert_gguf_to_hf  # noqa: E402


def _doctor(args, draft: Path, target: Path, url: str, png: Path) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = eagle3(["doctor", str(draft), "--target", str(target), "--url", url, "--serve-only",
                     "--dataset", args.dataset, "--limit", str(args.limit), "--max-new-tokens",
                     str(args.max_new_tokens), "--threads", "1", "--json", "--plot", str(png),
                     "--no-progress"])
    return rc, json.loads(out.getvalue())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True, type=Path, help="a draft trained for the bundled SmolLM2")
    p.add_argument("--mislabel", default="[layer_input:15, layer_input:27, layer_input:2]",
                   help="the stale copy's --layout (default: a list-order mix-up of [2, 15, 27])")
    p.add_argument("--dataset", default="mt-bench")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--scenarios", nargs="+", default=["stock", "stale"], choices=["stock", "stale"])
    p.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args()

    import sglang
    import torch

    work = Path(tempfile.mkdtemp(prefix="doctor-serve-"))
    target = convert_gguf_to_hf(work / "target")
    site = entry_point_site(REPO / "pyproject.toml", work / "site")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for scenario in args.scenarios:
        served, env = args.draft, {}
        if scenario == "stock":
            env = dict(STOCK_CAPTURE_ENV)   # the CPU platform only, no eagle3 plugin
        else:
            served = work / "stale-draft"
            assert eagle3(["convert", str(args.draft), str(served), "--to", "sglang",
                           "--layout", args.mislabel]) == 0
        spec = ServerSpec(str(target), str(served), num_steps=3, topk=1, num_draft_tokens=4)
        log = work / f"{scenario}.log"
        t0 = time.time()
        with CpuServer(spec, log, pythonpath=(str(site), str(REPO)), env_extra=env,
                       start_timeout=600.0) as srv:
            png = args.out_dir / f"doctor-serve-{scenario}.png"
            rc, report = _doctor(args, args.draft, target, srv.url, png)
            plugin_active = srv.plugin_active()
        report["run"] = {
            "scenario": scenario, "served_draft": str(served), "server_env": env, "exit_code": rc,
            "plugin_active": plugin_active,
            "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                       f"{os.cpu_count()} CPUs",
            "versions": {"sglang": sglang.__version__, "torch": torch.__version__,
                         "python": platform.python_version()},
            "command": " ".join(["python", *sys.argv]), "seconds": round(time.time() - t0, 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        dest = args.out_dir / f"doctor-serve-{scenario}.json"
        dest.write_text(json.dumps(report, indent=2) + "\n")
        s = report["serve"]
        print(f"{scenario}: SERVE {s['verdict'].upper()} served {s['served_acceptance_length']:.3f} "
              f"offline {s['offline_acceptance_length']:.3f} t={s['paired_t']} "
              f"identical {s['identical_answers']}/{len(s['prompts'])} plugin={report['run']['plugin_active']} "
              f"-> {dest}")
        failed += rc not in (0, 1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
