"""Training levers, measured one at a time: `eagle3 train` short runs that differ in one setting.

Every variant trains the bundled SmolLM2-135M-Instruct's draft from the same teacher-forced
cache (`make draft`'s: ShareGPT, 512-token chats, draft vocabulary 8192) with the same seed,
and reports held-out top-1 by TTT position at equal steps and the seconds it took. The
baseline is `make draft`'s recipe (lr 2e-3, TTT 3, 512 batch tokens, one thread); each other
variant changes one lever. The draft vocabulary is measured as coverage (no training: the
cache fixes the vocabulary), over held-out ShareGPT answers.

Each variant's draft lands in --workdir/NAME; a finished one (train_report.json) is reused,
so a killed sweep continues where it stopped. Writes NAME.json (machine, versions, git
revision, every command, every report) and NAME.png under --output-dir.

    python benchmarks/train_levers.py                      # all variants, 300 steps each
    python benchmarks/train_levers.py --only lr-6e-3 ttt-1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

CACHE = Path.home() / ".cache" / "eagle3-backend" / "train-data" / "teacher-smollm2-sharegpt-512"

# name -> (lever, flags that differ from the baseline, steps multiplier)
# batch-2048 runs a quarter of the steps: the same tokens as the baseline.
VARIANTS: dict[str, tuple[str, list[str], float]] = {
    "baseline": ("baseline", [], 1.0),
    "lr-6e-3": ("learning rate", ["--lr", "6e-3"], 1.0),
    "lr-6e-4": ("learning rate", ["--lr", "6e-4"], 1.0),
    "lr-2e-4": ("learning rate", ["--lr", "2e-4"], 1.0),
    "mlp-4096": ("draft MLP width", ["--intermediate-size", "4096"], 1.0),
    "layers-2": ("draft layers", ["--draft-layers", "2"], 1.0),
    "ttt-1": ("TTT depth", ["--ttt-steps", "1"], 1.0),
    "batch-2048": ("batch tokens", ["--batch-tokens", "2048"], 0.25),
    "threads-2": ("threads", ["--threads", "2"], 1.0),
    # `make draft`'s finished 4,000-step draft (lr 2e-3), trained on at a lower lr
    "continue-6e-4": ("init from a trained draft", ["--init-from", "{make_draft}", "--lr", "6e-4"], 1.0),
}
VOCAB_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


def variant_flags(flags: list[str], args: argparse.Namespace) -> dict[str, str]:
    """The baseline's flags with a variant's changes applied."""
    base = {"--threads": "1", "--lr": "2e-3", "--ttt-steps": "3", "--batch-tokens": "512"}
    it = iter(flags)
    for k in it:
        base[k] = next(it).format(make_draft=args.make_draft)
    return base


def train_command(name: str, flags: dict[str, str], steps: int, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "eagle3_backend", "train", "--target", "bundled",
           "--dataset", "sharegpt", "--source", "teacher", "--teacher-tokens", str(args.teacher_tokens),
           "--max-seq-tokens", "512", "--teacher-cache", str(args.teacher_cache),
           "--steps", str(steps), "--eval-every", str(max(1, steps // 2)), "--seed", "0",
           "--no-progress", "--out", str(Path(args.workdir) / name), "--force"]
    for k, v in flags.items():
        cmd += [k, v]
    return cmd


def run_variant(name: str, args: argparse.Namespace) -> dict:
    lever, flags, mult = VARIANTS[name]
    steps = max(1, round(args.steps * mult))
    settings = variant_flags(flags, args)
    cmd = train_command(name, settings, steps, args)
    report_path = Path(args.workdir) / name / "train_report.json"
    if not report_path.is_file():
        print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": settings["--threads"]}
        t0 = time.time()
        log = Path(args.workdir) / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"[{name}] eagle3 train failed ({proc.returncode}); see {log}")
        print(f"[{name}] done in {time.time() - t0:.0f} s", flush=True)
    r = json.loads(report_path.read_text())
    t = r["training"]
    return {"lever": lever, "flags": flags, "command": ["eagle3", *cmd[3:]], "steps": t["steps"],
            "train_seconds": t["train_seconds"],
            "seconds_per_step": round(t["train_seconds"] / max(1, t["steps"]), 3),
            "heldout_top1_by_position": r["heldout_top1_by_position"],
            "heldout_expected_acceptance_length": r["heldout_expected_acceptance_length"],
            "heldout_chain_acceptance_length": r.get("heldout_chain_acceptance_length"),
            "train_top1_by_position": t["train_top1_by_position"],
            "heldout_curve": t["heldout_curve"]}


def _cache_split(cache_dir: Path, max_tokens: int) -> tuple[list, list, int, int]:
    from eagle3_backend.train.teacher import TeacherCache, heldout_conversation
    from eagle3_backend.train.trainer import TrainSettings

    meta = json.loads((cache_dir / TeacherCache.META).read_text())
    cache = TeacherCache(cache_dir, meta["identity"])
    V, H = cache.read_target()[1].shape
    fraction = TrainSettings().heldout_fraction   # the runs' split (`eagle3 train`'s default)
    train, held = [], []
    for s in cache.sequences(max_tokens):
        (held if heldout_conversation(s.id, fraction) else train).append(s)
    return train, held, int(V), int(H)


def vocab_coverage(train: list, held: list, V: int, H: int) -> dict:
    """Held-out answer coverage of a frequency vocabulary of each size (train answers' counts)."""
    from eagle3_backend.train.vocab import build_vocab_map, token_counts

    counts = token_counts([s.tokens[s.assistant_mask()] for s in train], V)
    held_counts = token_counts([s.tokens[s.assistant_mask()] for s in held], V)
    out = {}
    for size in VOCAB_SIZES:
        vm = build_vocab_map(counts, min(size, V))
        out[str(size)] = {"heldout_coverage": round(vm.coverage(held_counts), 4),
                          "train_coverage": round(vm.coverage(counts), 4),
                          "lm_head_mib_bf16": round(min(size, V) * H * 2 / 2**20, 2)}
    return out


def ngram_reference(train: list, held: list) -> dict:
    """What the draft's step 0 must beat: its label (the target's choice after x_{i+1}) guessed
    from the fed token alone (unigram) or with the one before it (bigram), counted on the
    training answers, scored on the held-out ones (the rows the trainer scores)."""
    import collections

    def rows(s):
        t, lab, a = s.tokens.tolist(), s.labels.tolist(), s.assistant.tolist()
        for i in range(len(t) - 2):
            if a[i + 1] and a[i + 2]:
                yield t[i], t[i + 1], lab[i + 1]

    uni, bi = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for s in train:
        for p, c, lab in rows(s):
            uni[c][lab] += 1
            bi[(p, c)][lab] += 1
    n = hit_u = hit_b = 0
    for s in held:
        for p, c, lab in rows(s):
            n += 1
            u = uni[c].most_common(1)[0][0] if c in uni else -1
            hit_u += u == lab
            hit_b += (bi[(p, c)].most_common(1)[0][0] if (p, c) in bi else u) == lab
    return {"heldout_rows": n, "unigram_top1": round(hit_u / max(1, n), 4),
            "bigram_top1": round(hit_b / max(1, n), 4)}


def plot(path: Path, runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, r in runs.items():
        pts = [(c["step"], c["top1_by_position"][0]) for c in r["heldout_curve"]]
        secs = r["seconds_per_step"]
        axes[0].plot([p[0] / r["steps"] for p in pts], [p[1] for p in pts], marker="o", label=name)
        axes[1].plot([p[0] * secs / 60 for p in pts], [p[1] for p in pts], marker="o", label=name)
    axes[0].set_xlabel("fraction of the run (equal tokens except TTT)")
    axes[1].set_xlabel("training minutes")
    for ax in axes:
        ax.set_ylabel("held-out top-1, position 0")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("eagle3 train levers, SmolLM2-135M teacher-forced ShareGPT, one at a time", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="baseline steps per variant (default 300)")
    ap.add_argument("--only", nargs="*", choices=sorted(VARIANTS), default=None)
    ap.add_argument("--teacher-cache", type=Path, default=CACHE)
    ap.add_argument("--teacher-tokens", type=int, default=256000)
    ap.add_argument("--make-draft", default=str(Path.home() / ".cache" / "eagle3-backend" / "drafts" /
                                                "smollm2-fd7efaa77837"),
                    help="the finished `make draft` draft the continue-* variants start from")
    ap.add_argument("--workdir", default=str(ROOT / "artifacts" / "train-levers"))
    ap.add_argument("--output-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="train-levers")
    args = ap.parse_args()
    from eagle3_backend.verify.report import environment

    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in args.only or list(VARIANTS):
        runs[name] = run_variant(name, args)
        record = {"runs": runs, "command": ["python", *sys.argv], "environment": environment()}
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
        plot(out / f"{args.name}.png", runs)
        r = runs[name]
        print(f"{name:12s} {r['steps']:5d} steps {r['seconds_per_step']:.2f} s/step  held-out top-1 "
              f"{r['heldout_top1_by_position']}  expected acceptance {r['heldout_expected_acceptance_length']}"
              f" (replayed {r['heldout_chain_acceptance_length']})",
              flush=True)
    split = _cache_split(args.teacher_cache, args.teacher_tokens)
    record["vocab_coverage"] = vocab_coverage(*split)
    record["ngram_reference"] = ngram_reference(*split[:2])
    (Path(args.output_dir) / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    for size, c in record["vocab_coverage"].items():
        print(f"draft vocab {size:>6s}: held-out coverage {c['heldout_coverage']:.3f}")
    ng = record["ngram_reference"]
    print(f"step-0 label from the fed token alone: unigram {ng['unigram_top1']:.3f}, "
          f"bigram {ng['bigram_top1']:.3f} over {ng['heldout_rows']} held-out rows")


if __name__ == "__main__":
    main()
