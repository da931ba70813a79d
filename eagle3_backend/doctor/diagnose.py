"""Score a draft under its recorded layout and every candidate, more prompts at a time
until the verdict is settled (the rule: :mod:`eagle3_backend.doctor.verdict`).

    states = collect_states(target, prompts[:8])
    more = (collect_states(target, chunk) for chunk in (prompts[8:16], prompts[16:32]))
    report = diagnose(draft_dir, target, states, more=more)
    report.verdict, report.best.layout, report.recorded.top1

Look 1 scores the fixed candidates (:func:`candidate_layouts`) and runs the coordinate
search from the best of them; each further look scores, on the new prompts, only the
recorded layout and the candidates not yet ruled out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from eagle3_backend.checkpoint.files import TRAIN_REPORT as REPORT_NAME
from eagle3_backend.doctor.candidates import candidate_layouts, coordinate_search, describe_move
from eagle3_backend.doctor.report import DoctorReport
from eagle3_backend.doctor.scoring import ACCEPT_STEPS, Score, Scorer, all_sources
from eagle3_backend.doctor.verdict import (
    INCONCLUSIVE,
    MARGIN,
    MISMATCH,
    OK,
    WEAK,
    Z,
    Decision,
    Look,
    Paired,
    decide,
    sequential,
)
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout

SHOWN = 5   # layouts listed by gap beyond the fixed candidates and the search path
AS_GOOD_SHOWN = 4  # layouts as good as the best, named in the message


def judge(scores: Sequence[Score], proposed: set[Layout] | None = None) -> Decision:
    """The decision over ``scores`` (the recorded layout first); ``proposed``: the
    layouts named for a reason (default: all), see :func:`decide`."""
    return decide([s.hits for s in scores],
                  None if proposed is None else [s.layout in proposed for s in scores])


def message(decision: Decision, scores: Sequence[Score], prompts: int) -> str:
    """What the decision means, with the figures behind it (scores: recorded first)."""
    rec, best = scores[0], scores[decision.best]
    n = best.scored
    rec_top1 = float(rec.hits[:n].float().mean()) if n else 0.0
    if decision.verdict == WEAK:
        return (f"the draft predicts poorly under every layout tried (best top-1 {best.top1:.3f} "
                f"over {rec.scored} tokens), so the layout is not what is wrong. Check that this "
                "is the target the draft was trained for, its vocabulary map (d2t), and the chat "
                "template; or the draft is untrained.")
    if decision.verdict == MISMATCH:
        p = decision.paired[decision.best]
        return (f"the draft behaves as if trained on {best.layout} (top-1 {best.top1:.3f}), not on "
                f"the recorded {rec.layout} (top-1 {rec_top1:.3f} on the same {n} tokens; gap "
                f"{p.gap:+.3f}, at least {p.lower:+.3f}; paired z = {p.z:.1f}): {best.why}. Record "
                f"the layout it was trained on: eagle3 convert DRAFT OUT --to sglang --layout "
                f"\"{best.layout}\", then run the doctor on OUT.")
    if decision.verdict == OK:
        if decision.best == 0:
            runner = max(scores[1:], key=lambda s: s.top1 - float(rec.hits[:s.scored].float().mean()),
                         default=rec)
            return (f"the recorded layout {rec.layout} fits the draft best (top-1 {rec.top1:.3f} "
                    f"over {rec.scored} tokens; next, {runner.layout}: {runner.top1:.3f}); no "
                    f"layout tried can beat it by {MARGIN}.")
        p = decision.paired[decision.best]
        return (f"the recorded layout {rec.layout} (top-1 {rec_top1:.3f}) is within {MARGIN} of "
                f"every layout tried: the closest, {best.layout} ({best.top1:.3f}), is ahead by "
                f"{p.gap:+.3f}, at most {p.upper:+.3f} ({Z:.0f} standard errors over {n} tokens).")
    focus = decision.best or max(decision.open, key=lambda i: decision.paired[i].upper)
    p, other = decision.paired[focus], scores[focus]
    return (f"cannot tell yet whether {other.layout} fits the draft better than the recorded "
            f"{rec.layout}: top-1 {other.top1:.3f} vs {float(rec.hits[:p.n].float().mean()):.3f} "
            f"over the same {p.n} tokens ({prompts} prompts), a gap of {p.gap:+.3f}, between "
            f"{p.lower:+.3f} and {p.upper:+.3f} ({Z:.0f} standard errors); a gap of {MARGIN} "
            f"matters ({len(decision.open)} layout(s) still open). Do not serve this draft as "
            f"recorded before this is settled.")


def trained_layout(draft_path: str | Path) -> Layout | None:
    """The layout ``eagle3 train`` trained the draft on, from the ``train_report.json`` it
    wrote beside the weights (in training order), or None without a readable one."""
    try:
        raw = json.loads((Path(draft_path) / REPORT_NAME).read_text())
        return Layout.parse(raw["layout"])
    except (OSError, ValueError, TypeError, KeyError, Eagle3Error):
        return None


def _record_says(decision: Decision, scores: Sequence[Score], trained: Layout) -> str:
    """The message when the training record names the recorded layout (written in layer
    order) while the fit alone prefers or cannot rule out another."""
    rec, best = scores[0], scores[decision.best]
    fit = (f"{best.layout} fits it better on these {best.scored} tokens (top-1 {best.top1:.3f} vs "
           f"{float(rec.hits[:best.scored].float().mean()):.3f}, paired z = "
           f"{decision.paired[decision.best].z:.1f})" if decision.best else
           "other layouts tried could not be ruled out on these tokens")
    return (f"the recorded layout {rec.layout} is the one eagle3 train trained this draft on "
            f"({REPORT_NAME} records {trained}, which the writer stores in layer order), so it "
            f"is right. By fit alone, {fit}: a draft that has learned little, or layers that "
            f"carry nearly the same states, can show that. Serve it as recorded.")


def diagnose(draft_path: str | Path, target: Any, states: Sequence[Any], *, loaded: Any = None,
             more: Iterable[Sequence[Any]] = (), search: bool = True) -> DoctorReport:
    """Score the draft at ``draft_path`` under its recorded layout and the candidates.

    target: the loaded :class:`eagle3_backend.verify.targets.Target` the states came
    from; states: :func:`collect_states` of it (reusable across drafts); more: further
    batches of states, each taken (and so collected, when a generator) only while the
    verdict is INCONCLUSIVE; search: run the coordinate search on ``states``; loaded:
    the checkpoint already read by ``load_draft`` against this target (else read here).
    """
    from eagle3_backend.checkpoint import load_draft
    from eagle3_backend.target import TargetInfo
    from eagle3_backend.verify.engine import attach_draft, load_draft_model

    if loaded is None:
        loaded = load_draft(draft_path, target=TargetInfo.from_path(target.path))
    draft = attach_draft(load_draft_model(draft_path, target, dtype=torch.float32, loaded=loaded),
                         target)
    layers, sources = target.num_layers, all_sources(target.num_layers)
    seen = list(states)
    scorer = Scorer(draft, seen, sources)
    scores = {c.layout: Score(c.layout, c.why, scorer.hits(c.layout)[0])
              for c in candidate_layouts(draft.config.layout, layers)}
    fixed, path, start = len(scores), [], None
    if search:
        rec_hits = next(iter(scores.values())).hits
        start = max(scores.values(), key=lambda s: Paired.of(s.hits, rec_hits).gap)  # ties: recorded

        def correct(layout: Layout) -> int:
            if layout not in scores:
                scores[layout] = Score(layout, describe_move(start.layout, layout), scorer.hits(layout)[0])
            return scores[layout].correct

        path = coordinate_search(start.layout, layers, correct)
    order = list(scores.values())  # the recorded layout first
    proposed = set(list(scores)[:fixed]) | set(path)
    counts = [(len(seen), order[0].scored)]   # prompts and tokens after each look

    def looks() -> Iterator[Look]:
        for batch in more:  # a generator collects the next prompts' states only now
            batch = list(batch)
            if not batch:
                continue
            seen.extend(batch)
            scorer = Scorer(draft, batch, sources)

            def look(which: tuple[int, ...]) -> list[torch.Tensor]:
                new = [scorer.hits(order[i].layout)[0] for i in which]
                counts.append((len(seen), counts[-1][1] + new[0].numel()))
                return new

            yield look

    hits, decisions = sequential([s.hits for s in order], looks(),
                                 [s.layout in proposed for s in order])
    for score, h in zip(order, hits):
        score.hits = h
    decision = decisions[-1]
    looks_done = [{"prompts": n, "tokens": t, "verdict": d.verdict,
                   "best": order[d.best].layout.to_strings(), "open": len(d.open)}
                  for (n, t), d in zip(counts, decisions)]

    rec, best = order[0], order[decision.best]
    text, verdict = message(decision, order, len(seen)), decision.verdict
    trained = trained_layout(draft_path)
    if trained is not None and trained.sorted_order()[0] == rec.layout:
        if verdict in (MISMATCH, INCONCLUSIVE):
            text, verdict = _record_says(decision, order, trained), OK
    elif trained is not None:
        text += (f" Its {REPORT_NAME} records that eagle3 train trained it on {trained}, not "
                 f"on the recorded {rec.layout}.")
    full = Scorer(draft, seen, sources, ACCEPT_STEPS)
    acceptance = {}
    for name, score in (("recorded", rec), ("best", best)):
        if name == "best" and score is rec:
            acceptance[name] = acceptance["recorded"]
            continue
        top1, length = full.expected_acceptance(score.layout)
        acceptance[name] = {"layout": score.layout.to_strings(),
                            "top1_by_step": [round(a, 4) for a in top1],
                            "expected_acceptance_length": round(length, 3)}
    # layouts the best does not beat on these tokens (paired interval reaching 0): neighbouring
    # layers carry nearly the same states, so the truth may be any of them
    as_good = sorted((s for s in order if s is not best and s is not rec
                      and Paired.of(best.hits, s.hits).lower <= 0), key=lambda s: -s.top1)
    if verdict == MISMATCH:
        text += (f" Served as recorded, the expected chain acceptance is "
                 f"{acceptance['recorded']['expected_acceptance_length']:.2f} instead of "
                 f"{acceptance['best']['expected_acceptance_length']:.2f}.")
        if as_good:
            names = ", ".join(str(s.layout) for s in as_good[:AS_GOOD_SHOWN])
            more = len(as_good) - AS_GOOD_SHOWN
            text += (f" As good as {best.layout} on these {best.scored} tokens, so possibly the one "
                     f"it was trained on: {names}" + (f" and {more} more" if more > 0 else "")
                     + "; the training run's own record (its layout flag) settles it.")
    for i, score in enumerate(order):
        score.vs_recorded = decision.paired[i]
    named = {s.layout for s in as_good[:AS_GOOD_SHOWN]}
    keep = {i for i, s in enumerate(order) if s.layout in proposed or s.layout in named}
    keep.add(decision.best)
    ranked = sorted(range(len(order)), key=lambda i: (-(decision.paired[i].gap if i else 0.0), i))
    keep |= set(ranked[:SHOWN])
    tokens = order[0].scored
    settle = decision.tokens_to_settle if verdict == INCONCLUSIVE else 0
    return DoctorReport(
        draft=str(draft_path), target=str(target.path), layout_source=loaded.layout_source,
        prompts=len(seen), scores=[order[i] for i in ranked if i in keep], recorded=rec,
        best=best, verdict=verdict, message=text, z=(decision.paired[decision.best].z
                                                             if decision.best else 0.0),
        extra={"layout_explanation": loaded.layout_explanation,
               "trained_layout": trained.to_strings() if trained is not None else None,
               "answer_tokens": sum(s.answer_len for s in seen),
               "searched": {"start": start.layout.to_strings() if start else None,
                            "path": [p.to_strings() for p in path], "layouts": len(order) - fixed},
               "as_good_as_best": [s.layout.to_strings() for s in as_good],
               "looks": looks_done,
               "prompts_to_settle": (math.ceil(settle * len(seen) / tokens) if settle else 0),
               "expected_chain_acceptance": acceptance})

