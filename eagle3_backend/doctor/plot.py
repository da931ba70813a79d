"""``eagle3 doctor --plot``: the layouts' scores, and served vs offline acceptance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from eagle3_backend.errors import Eagle3Error


def plot_scores(report: Any, path: str | Path, serve: Any = None) -> Path:
    """Horizontal bars of top-1 per layout, the recorded one highlighted; with a
    :class:`eagle3_backend.doctor.serve.ServeReport`, a second panel of offline vs served
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
