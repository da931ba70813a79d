"""The doctor's reports as data (:class:`DoctorReport`) and as text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_backend.doctor.verdict import MARGIN, MISMATCH, Z
from eagle3_backend.layout import Layout


@dataclass(slots=True)
class DoctorReport:
    """The layouts worth showing, best first (by their gap over the recorded one);
    ``recorded`` is the one the checkpoint records (also in ``scores``); ``z`` is the
    paired z of the best over the recorded."""

    draft: str
    target: str
    layout_source: str
    prompts: int
    scores: list[Any]          # doctor.scoring.Score
    recorded: Any
    best: Any
    verdict: str
    message: str
    z: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"draft": self.draft, "target": self.target, "verdict": self.verdict,
                "message": self.message, "layout_source": self.layout_source,
                "recorded": self.recorded.as_dict(), "best": self.best.as_dict(),
                "z_best_vs_recorded": round(self.z, 2), "prompts": self.prompts,
                "margin": MARGIN, "z_bound": Z,
                "scores": [s.as_dict() for s in self.scores], **self.extra}


def format_report(report: DoctorReport) -> str:
    width = max(len(str(s.layout)) for s in report.scores)
    searched = report.extra.get("searched", {})
    looks = report.extra.get("looks", [])
    lines = [
        f"eagle3 doctor: draft {report.draft} on target {report.target}",
        f"  {report.prompts} prompts, {report.recorded.scored} answer tokens scored: the draft's "
        f"first step, top-1 vs the target's greedy token",
        f"  recorded layout {report.recorded.layout} ({report.layout_source})",
    ]
    if len(looks) > 1:
        lines.append("  looks: " + "; ".join(f"{lk['prompts']} prompts -> {lk['verdict']}"
                                             for lk in looks))
    lines += ["", f"    {'layout':<{width}}  top-1   gap     tokens  why tried"]
    for s in report.scores:
        mark = "*" if s is report.recorded else " "
        gap = f"{s.vs_recorded.gap:+.3f}" if s.vs_recorded is not None else "     "
        lines.append(f"  {mark} {str(s.layout):<{width}}  {s.top1:.3f}  {gap}  {s.scored:6d}  {s.why}")
    if searched.get("start") is not None:
        listed = sum(s.why.startswith("coordinate search") for s in report.scores)
        lines.append(f"  (coordinate search from {Layout.parse(searched['start'])}: {searched['layouts']} "
                     f"more layouts tried, each slot over every layer; {searched['layouts'] - listed} "
                     f"not listed)")
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


def format_serve_report(report: Any) -> str:
    """A :class:`eagle3_backend.doctor.serve.ServeReport` as text."""
    s = report.settings
    lines = [
        f"eagle3 doctor --url {report.url}: served vs offline acceptance",
        f"  server: draft {report.server.get('draft')}, target {report.server.get('target')}, "
        f"steps {s['speculative_num_steps']}, topk {s['speculative_eagle_topk']}, "
        f"draft tokens {s['speculative_num_draft_tokens']}",
        "",
        f"    {'prompt':<16} offline  served  answers",
    ]
    for p in report.prompts:
        same = "identical" if p.diverge_at is None else f"differ from token {p.diverge_at}"
        lines.append(f"    {p.id[:16]:<16} {p.offline_acceptance:7.2f} {p.served_acceptance:7.2f}  {same}")
    lines.append(f"    {'all':<16} {report.offline_acceptance:7.2f} {report.served_acceptance:7.2f}  "
                 f"{report.identical_answers}/{len(report.prompts)} identical")
    lines += [f"  note: {n}" for n in report.notes]
    lines += ["", f"SERVE {report.verdict.upper()}: {report.message}"]
    return "\n".join(lines)
