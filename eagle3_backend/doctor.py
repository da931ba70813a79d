"""``eagle3 doctor``: find the hidden states a draft was really trained on.

A draft served on other hidden states than it was trained on loads without an
error and collapses (74.7% training accuracy, 34.1% served). The layout a
checkpoint records is only as good as the tool that wrote it; the doctor asks
the draft itself. It runs the target once over real prompts and its own greedy
answers, capturing every residual-stream state (``embed``, ``layer_input:1``
.. ``layer_input:L``), then scores the draft's first speculative step (top-1
against the target's greedy next token, answer tokens only) with the fc input
built from each candidate layout:

* the recorded layout (what this backend serves);
* every slot shifted one or two layers (SpecForge "output of k" read as
  speculators "input of k", and the reverse: the off-by-one of the conventions
  table);
* the same states in another fc order (list order vs layer order);
* ``embed`` in place of ``layer_input:1`` and the reverse;
* the engines' default layout for this target (inputs of 2, L//2, L-3).

A recorded layout that scores clearly below another candidate is a train/serve
wiring mismatch; the report names the layout that fits and how to record it.

    states = collect_states(target, prompts)      # once per target and prompt set
    report = diagnose(draft_dir, target, states)
    report.verdict, report.best.layout, report.recorded.top1
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout

logger = logging.getLogger(__name__)

OK, MISMATCH, WEAK = "ok", "mismatch", "weak"
WEAK_TOP1 = 0.10          # below this under every layout, the layout is not the problem
ACCEPT_STEPS = 3          # TTT steps behind the expected chain acceptance length
MIN_GAIN = 0.02           # a candidate must beat the recorded layout by at least this much ...
Z_MISMATCH = 3.0          # ... and by 3 standard errors of the paired difference (McNemar)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout to try and why it is a plausible wiring."""

    layout: Layout
    why: str


@dataclass(slots=True)
class Score:
    """``hits`` [scored] bool: which scored tokens the draft got right (same rows, same
    order for every layout, so two layouts compare token by token)."""

    layout: Layout
    why: str
    hits: torch.Tensor

    @property
    def correct(self) -> int:
        return int(self.hits.sum())

    @property
    def scored(self) -> int:
        return int(self.hits.numel())

    @property
    def top1(self) -> float:
        return self.correct / self.scored if self.scored else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.layout.to_strings(), "why": self.why, "top1": round(self.top1, 4),
                "correct": self.correct, "scored": self.scored}


@dataclass(slots=True)
class DoctorReport:
    """Every layout's score, best first; ``recorded`` is the one the checkpoint records
    (also in ``scores``); ``z`` is the paired z of the best over the recorded."""

    draft: str
    target: str
    layout_source: str
    prompts: int
    scores: list[Score]
    recorded: Score
    verdict: str
    message: str
    z: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> Score:
        return self.scores[0]

    def as_dict(self) -> dict[str, Any]:
        return {"draft": self.draft, "target": self.target, "verdict": self.verdict,
                "message": self.message, "layout_source": self.layout_source,
                "recorded": self.recorded.as_dict(), "best": self.best.as_dict(),
                "z_best_vs_recorded": round(self.z, 2), "prompts": self.prompts,
                "scores": [s.as_dict() for s in self.scores], **self.extra}


# ------------------------------------------------------------------------- candidates
def candidate_layouts(recorded: Layout, num_layers: int,
                      max_permuted_slots: int = 4) -> list[Candidate]:
    """The recorded layout first, then the plausible miswirings of it (deduplicated,
    each with as many slots as the recorded one, every layer in [0, num_layers])."""
    recorded = Layout.parse(recorded)
    out: dict[Layout, str] = {recorded: "recorded"}

    def add(layers: Sequence[int], why: str) -> None:
        if all(0 <= k <= num_layers for k in layers) and len(set(layers)) == len(layers):
            out.setdefault(Layout.of_layers(layers), why)

    layers = list(recorded.layers)
    for shift, why in ((-1, "every slot one layer earlier (ids read as input-of-k, trained as output-of-k)"),
                       (+1, "every slot one layer later (ids read as output-of-k, trained as input-of-k)"),
                       (-2, "every slot two layers earlier"), (+2, "every slot two layers later")):
        add([k + shift for k in layers], why)
    if len(layers) <= max_permuted_slots:
        for perm in itertools.permutations(layers):
            add(perm, "the same states in another fc order (list order vs layer order)")
    if 0 in layers:
        add([1 if k == 0 else k for k in layers], "layer_input:1 where the recorded layout has embed")
    if 1 in layers:
        add([0 if k == 1 else k for k in layers], "embed where the recorded layout has layer_input:1")
    default = Layout.eagle_repo(num_layers)
    if len(default) == len(recorded):
        out.setdefault(default, "the engines' default (inputs of 2, L//2, L-3): what a draft that "
                                "records no layer ids is served with")
    return [Candidate(lay, why) for lay, why in out.items()]


# ---------------------------------------------------------------------------- scoring
class _Scorer:
    """The draft run over captured states with the fc input of any layout.

    sequences: DataSequence-like (tokens [L], prompt_len, aux [L-1, len(all_sources)*H]
    holding every source of ``all_sources``). Rows scored at TTT step j: answer
    positions i whose token x_{i+2+j} is known, as ``eagle3 train`` scores them.
    """

    def __init__(self, draft: Any, sequences: Sequence[Any], all_sources: Layout,
                 ttt_steps: int, batch_tokens: int = 2048) -> None:
        from eagle3_backend.train.trainer import make_batches

        self.draft, self.all_sources, self.ttt_steps = draft, all_sources, ttt_steps
        self.slot_of = {s: i for i, s in enumerate(all_sources.sources)}
        self.batches = make_batches(sequences, batch_tokens, ttt_steps)  # fixed order: no rng

    @torch.no_grad()
    def hits(self, layout: Layout, steps: int = 1) -> list[torch.Tensor]:
        """[scored rows] bool per TTT step: the draft's top-1 equals the target's token."""
        from eagle3_backend.train.trainer import ttt_forward

        if steps > self.ttt_steps:
            raise ValueError(f"scorer built for {self.ttt_steps} TTT steps, asked for {steps}")
        draft, hidden = self.draft, self.draft.config.target_hidden_size
        head = draft.head_weight                                                  # [Vd, H]
        index = torch.tensor([self.slot_of[s] for s in layout.sources])
        per_step: list[list[torch.Tensor]] = [[] for _ in range(steps)]
        for b in self.batches:
            B, T = b.aux.shape[:2]
            aux = b.aux.view(B, T, len(self.all_sources), hidden)[:, :, index].reshape(B, T, -1)
            rows = torch.arange(T)[None]
            answer = rows >= b.prompt_lens[:, None] - 1
            for j, normed in enumerate(ttt_forward(draft, b.tokens, aux.to(head.dtype), steps)):
                use = answer & (rows + 1 + j <= b.lengths[:, None] - 2)
                if bool(use.any()):
                    pred = draft.draft_to_target((normed[use] @ head.T).argmax(dim=-1))  # target ids
                    per_step[j].append(pred.cpu() == b.tokens[:, 2 + j:2 + j + T][use])  # x_{i+2+j}
        return [torch.cat(h) if h else torch.zeros(0, dtype=torch.bool) for h in per_step]

    def expected_acceptance(self, layout: Layout) -> tuple[list[float], float]:
        """Top-1 of each TTT step and the chain acceptance length they imply."""
        from eagle3_backend.train.trainer import expected_acceptance_length

        top1 = [float(h.float().mean()) if h.numel() else 0.0
                for h in self.hits(layout, self.ttt_steps)]
        return top1, float(expected_acceptance_length(top1))


def paired_z(better: Score, worse: Score) -> float:
    """McNemar z of ``better`` over ``worse`` on the same tokens: (c - b) / sqrt(b + c), with
    c the tokens only ``better`` gets right and b those only ``worse`` gets right."""
    only_better = int((better.hits & ~worse.hits).sum())
    only_worse = int((worse.hits & ~better.hits).sum())
    if only_better + only_worse == 0:
        return 0.0
    return (only_better - only_worse) / math.sqrt(only_better + only_worse)


def judge(scores: Sequence[Score]) -> tuple[str, str, float, list[Score]]:
    """(verdict, message, z of the best over the recorded, scores best first).
    scores[0] must be the recorded layout."""
    recorded = scores[0]
    ranked = sorted(scores, key=lambda s: (-s.top1, s is not recorded))
    best = ranked[0]
    z = paired_z(best, recorded)
    if best.top1 < WEAK_TOP1:
        return WEAK, (
            f"the draft predicts poorly under every layout tried (best top-1 {best.top1:.3f} over "
            f"{recorded.scored} tokens), so the layout is not what is wrong. Check that this is the "
            "target the draft was trained for, its vocabulary map (d2t), and the chat template; "
            "or the draft is untrained."), z, ranked
    if best is not recorded and best.top1 - recorded.top1 >= MIN_GAIN and z >= Z_MISMATCH:
        return MISMATCH, (
            f"the draft behaves as if trained on {best.layout} (top-1 {best.top1:.3f}), not on the "
            f"recorded {recorded.layout} (top-1 {recorded.top1:.3f}; paired z = {z:.1f}): {best.why}. "
            f"Record the layout it was trained on: "
            f"eagle3 convert DRAFT OUT --to sglang --layout \"{best.layout}\", then run the doctor "
            "on OUT."), z, ranked
    if best is recorded:
        runner = next((s for s in ranked if s is not recorded), recorded)
        return OK, (
            f"the recorded layout {recorded.layout} fits the draft best (top-1 {recorded.top1:.3f}; "
            f"next, {runner.layout}: {runner.top1:.3f})."), z, ranked
    return OK, (
        f"the recorded layout {recorded.layout} (top-1 {recorded.top1:.3f}) is within noise of the "
        f"best, {best.layout} ({best.top1:.3f}, paired z = {z:.1f} < {Z_MISMATCH:.0f}): no evidence "
        "of a mismatch. Neighbouring layers carry similar states; more prompts (--limit) sharpen "
        "the comparison."), z, ranked


def collect_states(target: Any, prompts: Sequence[Any], *, max_new_tokens: int = 48,
                   max_prompt_tokens: int = 512, batch_size: int = 8, chat_template: bool = True,
                   progress: bool = False) -> list[Any]:
    """The target's greedy answers to ``prompts`` with every residual-stream state
    captured: DataSequences whose aux is [L-1, (num_layers + 1) * H] in the order
    embed, layer_input:1 .. layer_input:num_layers (see :func:`all_sources`)."""
    from eagle3_backend.train.data import generate_sequences

    # Every layer's states are kept: fp32 targets keep fp32, others their 16-bit dtype.
    store = "float32" if target.dtype == torch.float32 else "bfloat16"
    sequences, _ = generate_sequences(
        target, prompts, all_sources(target.num_layers), max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens, batch_size=batch_size, store_dtype=store,
        chat_template=chat_template, progress=progress, desc="doctor: target answers")
    return sequences


def all_sources(num_layers: int) -> Layout:
    """[embed, layer_input:1, .., layer_input:num_layers]: every state a layout can name."""
    return Layout.of_layers(range(num_layers + 1))


def diagnose(draft_path: str | Path, target: Any, states: Sequence[Any], *,
             loaded: Any = None) -> DoctorReport:
    """Score the draft at ``draft_path`` under its recorded layout and the candidates.

    target: the loaded :class:`eagle3_backend.verify.targets.Target` the states came
    from; states: :func:`collect_states` of it (reusable across drafts); loaded: the
    checkpoint already read by ``load_draft`` against this target (else read here).
    """
    from eagle3_backend.checkpoint import load_draft
    from eagle3_backend.target import TargetInfo
    from eagle3_backend.verify.engine import attach_draft, load_draft_model

    if loaded is None:
        loaded = load_draft(draft_path, target=TargetInfo.from_path(target.path))
    draft = attach_draft(load_draft_model(draft_path, target, dtype=torch.float32, loaded=loaded),
                         target)
    candidates = candidate_layouts(draft.config.layout, target.num_layers)
    sources = all_sources(target.num_layers)
    scorer = _Scorer(draft, states, sources, ACCEPT_STEPS)
    scores = [Score(c.layout, c.why, scorer.hits(c.layout)[0]) for c in candidates]
    verdict, message, z, ranked = judge(scores)
    acceptance = {}
    for name, score in (("recorded", scores[0]), ("best", ranked[0])):
        if name == "best" and score is scores[0]:
            acceptance[name] = acceptance["recorded"]
            continue
        top1, length = scorer.expected_acceptance(score.layout)
        acceptance[name] = {"layout": score.layout.to_strings(),
                            "top1_by_step": [round(a, 4) for a in top1],
                            "expected_acceptance_length": round(length, 3)}
    if verdict == MISMATCH:
        message += (f" Served as recorded, the expected chain acceptance is "
                    f"{acceptance['recorded']['expected_acceptance_length']:.2f} instead of "
                    f"{acceptance['best']['expected_acceptance_length']:.2f}.")
    return DoctorReport(
        draft=str(draft_path), target=str(target.path), layout_source=loaded.layout_source,
        prompts=len(states), scores=ranked, recorded=scores[0], verdict=verdict,
        message=message, z=z,
        extra={"layout_explanation": loaded.layout_explanation,
               "answer_tokens": sum(s.answer_len for s in states),
               "expected_chain_acceptance": acceptance})


# -------------------------------------------------------------------------------- CLI
def add_doctor_parser(subparsers: Any) -> Any:
    from eagle3_backend.verify.datasets import FILE_HELP
    from eagle3_backend.verify.targets import allow_pickle_help

    p = subparsers.add_parser(
        "doctor", help="find train/serve wiring mismatches: which hidden states the draft fits",
        description="Run the target on real prompts capturing every layer's input, then score "
                    "the draft's first step (top-1 vs the target's greedy token) under its "
                    "recorded layout and the plausible miswirings of it: off-by-one layer ids, "
                    "another fc order, embed vs layer_input:1, engine defaults. Exit 0 when the "
                    "recorded layout fits, 1 when another fits clearly better or none fits, 2 on "
                    "bad input. With --url it also sends the prompts to a live server and "
                    "compares its acceptance length with the offline verifier's (a server "
                    "without the plugin, or serving another draft or target, accepts less).")
    p.add_argument("draft", metavar="DRAFT", help="draft checkpoint directory (any supported format)")
    p.add_argument("--target", default="bundled",
                   help="HF model dir or .gguf file (default: the bundled SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--dataset", default="mt-bench",
                   help=f"mt-bench | sharegpt | {FILE_HELP} (default mt-bench)")
    p.add_argument("--limit", type=int, default=8, help="prompts to use (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=48,
                   help="greedy answer tokens per prompt to score on (default 48)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="target dtype (default float32)")
    p.add_argument("--device", default=None, help="cpu | cuda[:i] (default: cuda if available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-chat-template", action="store_true",
                   help="encode the raw user text (default: the target tokenizer's chat template)")
    p.add_argument("--url", default=None, metavar="URL",
                   help="also check a live SGLang server (e.g. http://127.0.0.1:30000) serving this "
                        "draft on this target: its acceptance length on the same prompts must match "
                        "the offline verifier's with the server's own settings")
    p.add_argument("--serve-only", action="store_true",
                   help="with --url: skip the layout scoring, only compare served vs offline")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds each request to --url may take (default 300)")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--plot", metavar="PNG", default=None, help="also draw the scores as a bar chart")
    p.add_argument("--allow-pickle", action="store_true", help=allow_pickle_help(True))
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_doctor)
    return p


def run_doctor(args: Any) -> int:
    import json

    from eagle3_backend.verify.datasets import load_prompts
    from eagle3_backend.verify.targets import load_target, resolve_device, set_threads

    if args.limit < 1 or args.max_new_tokens < 1:
        raise Eagle3Error(f"--limit ({args.limit}) and --max-new-tokens ({args.max_new_tokens}) "
                          "must be >= 1.")
    if args.serve_only and not args.url:
        raise Eagle3Error("--serve-only needs --url URL: the live server to check.")
    if not args.timeout > 0:
        raise Eagle3Error(f"--timeout must be > 0 seconds, got {args.timeout}.")
    if args.plot:
        from eagle3_backend.verify.report import check_plot_path

        check_plot_path(args.plot)  # before the run, not after it
    if args.url:  # before the offline run: a wrong --url is found in a second, not after it
        from eagle3_backend.verify.bench import check_reachable

        check_reachable(args.url, "--url", min(10.0, args.timeout))
    set_threads(args.threads)
    device = resolve_device(args.device)
    prompts = load_prompts(args.dataset, limit=args.limit)  # a wrong --dataset before the target
    target = load_target(args.target, dtype=args.dtype, device=device,
                         allow_pickle=args.allow_pickle, progress=not args.no_progress)
    from eagle3_backend.checkpoint import load_draft
    from eagle3_backend.target import TargetInfo

    # a wrong DRAFT (a target dir, a mismatched checkpoint) is reported now, not after the
    # run; read once, used by both checks below
    loaded = load_draft(args.draft, target=TargetInfo.from_path(target.path))
    run = {"dataset": args.dataset, "max_new_tokens": args.max_new_tokens,
           "chat_template": not args.no_chat_template}
    report = serve = None
    if not args.serve_only:
        states = collect_states(target, prompts, max_new_tokens=args.max_new_tokens,
                                chat_template=not args.no_chat_template,
                                progress=not args.no_progress)
        report = diagnose(args.draft, target, states, loaded=loaded)
        report.extra.update(run)
    if args.url:
        from eagle3_backend.serve_check import check_server

        serve = check_server(args.url, args.draft, target, prompts,
                             max_new_tokens=args.max_new_tokens,
                             chat_template=not args.no_chat_template, timeout_s=args.timeout,
                             progress=not args.no_progress, loaded=loaded)
    if args.json:
        out = report.as_dict() if report is not None else {"draft": str(args.draft),
                                                             "target": str(target.path), **run}
        if serve is not None:
            out["serve"] = serve.as_dict()
        print(json.dumps(out, indent=2))
    else:
        from eagle3_backend.serve_check import format_serve_report

        parts = ([format_report(report)] if report is not None else []) + (
            [format_serve_report(serve)] if serve is not None else [])
        print("\n\n".join(parts))
    if args.plot:  # after the report is printed: a failure here loses nothing
        plot_scores(report, args.plot, serve)
    verdicts = [r.verdict for r in (report, serve) if r is not None]
    return 0 if all(v == OK for v in verdicts) else 1


def format_report(report: DoctorReport) -> str:
    width = max(len(str(s.layout)) for s in report.scores)
    lines = [
        f"eagle3 doctor: draft {report.draft} on target {report.target}",
        f"  {report.prompts} prompts, {report.recorded.scored} answer tokens scored: the draft's "
        f"first step, top-1 vs the target's greedy token",
        f"  recorded layout {report.recorded.layout} ({report.layout_source})",
        "",
        f"    {'layout':<{width}}  top-1   why tried",
    ]
    for s in report.scores:
        mark = "*" if s is report.recorded else " "
        lines.append(f"  {mark} {str(s.layout):<{width}}  {s.top1:.3f}   {s.why}")
    acc = report.extra.get("expected_chain_acceptance", {})
    if acc:
        lines.append("")
        for name in ("recorded", "best") if report.best is not report.recorded else ("recorded",):
            a = acc[name]
            steps = ", ".join(f"{x:.3f}" for x in a["top1_by_step"])
            lines.append(f"  {name} {Layout.parse(a['layout'])}: top-1 by draft step [{steps}] -> "
                         f"expected chain acceptance {a['expected_acceptance_length']:.2f} "
                         f"({len(a['top1_by_step'])} steps, steps taken as independent)")
    lines += ["", f"{report.verdict.upper()}: {report.message}"]
    if report.verdict == MISMATCH and report.layout_source != "explicit":
        lines.append(f"  (this draft's layout is {report.layout_source}, so EAGLE3_LAYOUT=\""
                     f"{report.best.layout}\" at serve time also works)")
    return "\n".join(lines)


def plot_scores(report: DoctorReport | None, path: str | Path, serve: Any = None) -> Path:
    """Horizontal bars of top-1 per layout, the recorded one highlighted; with a
    :class:`eagle3_backend.serve_check.ServeReport`, a second panel of offline vs served
    acceptance length per prompt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in (report, serve) if p is not None]
    if not panels:
        raise Eagle3Error("nothing to plot: no layout report and no serve report")
    heights = [0.35 * len(report.scores) + 1.6] if report is not None else []
    if serve is not None:
        heights.append(0.3 * len(serve.prompts) + 1.8)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    axes = list(axes[:, 0])
    if report is not None:
        ax = axes.pop(0)
        scores = list(reversed(report.scores))  # best at the top
        colors = ["tab:red" if s is report.recorded else "tab:blue" for s in scores]
        ax.barh([str(s.layout) for s in scores], [s.top1 for s in scores], color=colors)
        ax.set_xlabel("first-step top-1 vs the target's greedy token")
        ax.set_title(f"eagle3 doctor: {report.verdict.upper()} (recorded layout in red)\n"
                     f"{Path(report.draft).name} on {Path(report.target).name}, "
                     f"{report.recorded.scored} tokens", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    if serve is not None:
        ax = axes.pop(0)
        names = [p.id for p in serve.prompts] + ["all"]
        offline = [p.offline_acceptance for p in serve.prompts] + [serve.offline_acceptance]
        served = [p.served_acceptance for p in serve.prompts] + [serve.served_acceptance]
        y = torch.arange(len(names), dtype=torch.float64).flip(0).tolist()
        ax.barh([v + 0.2 for v in y], offline, height=0.4, color="tab:blue", label="offline verifier")
        ax.barh([v - 0.2 for v in y], served, height=0.4, color="tab:orange", label=f"server {serve.url}")
        ax.set_yticks(y, names, fontsize=7)
        ax.set_xlim(0.9, max(offline + served) * 1.05)  # acceptance length is >= 1
        ax.set_xlabel("acceptance length (tokens per verify step)")
        ax.set_title(f"served vs offline: SERVE {serve.verdict.upper()} (paired t = {serve.t:.1f})\n"
                     f"draft {Path(serve.draft).name}, server's draft "
                     f"{Path(str(serve.server.get('draft'))).name}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
