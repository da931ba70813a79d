"""The doctor's verdicts, and the sequential rule that decides between layouts.

Every layout is scored on the same answer tokens, so two layouts compare token by
token: ``d_i = hit_candidate_i - hit_recorded_i`` in {-1, 0, 1}. Over n tokens with
c tokens only the candidate gets right and b only the recorded one does:

    gap = (c - b) / n                 se = sqrt(c + b + 1) / n
    lower, upper = gap -+ Z * se      (the +1 keeps a handful of tokens from looking certain)

At each look (8, 16, 32, 64 prompts by default) the doctor decides:

* WEAK        every layout's top-1 is below ``WEAK_TOP1``: the layout is not the problem;
* MISMATCH    the best candidate beats the recorded layout by ``gap >= MARGIN`` and
              ``lower >= 0``: it fits better, by a margin that matters;
* OK          every candidate's ``upper < MARGIN``: none can fit better by MARGIN;
* INCONCLUSIVE otherwise: score more prompts, or, with the budget spent, say so, with
              the gap, its bounds and about how many prompts would settle it.

``Z = 3`` at each of up to four looks keeps the chance of a wrong call over all looks
near 1% (Bonferroni); a candidate ruled out (``upper < MARGIN``) at one look is not
scored again. The doctor never says OK while a layout it tried may fit better.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

OK, MISMATCH, WEAK, INCONCLUSIVE = "ok", "mismatch", "weak", "inconclusive"
EXIT_CODES = {OK: 0, MISMATCH: 1, WEAK: 1, INCONCLUSIVE: 4}  # 2: bad input, 3: internal error

WEAK_TOP1 = 0.10   # below this under every layout, the layout is not the problem
MARGIN = 0.02      # a top-1 gap that matters
Z = 3.0            # standard errors of the paired gap at each look


@dataclass(frozen=True, slots=True)
class Paired:
    """A candidate against the recorded layout on the same ``n`` tokens: ``better``
    tokens only the candidate gets right, ``worse`` only the recorded one does."""

    n: int
    better: int
    worse: int

    @classmethod
    def of(cls, candidate: Sequence[bool] | object, recorded: Sequence[bool] | object) -> Paired:
        """From two bool tensors (or sequences) over the same tokens, compared on the
        tokens both cover (a layout no longer scored covers only the first ones)."""
        import torch

        cand = torch.as_tensor(candidate, dtype=torch.bool)
        rec = torch.as_tensor(recorded, dtype=torch.bool)
        n = min(cand.numel(), rec.numel())
        cand, rec = cand[:n], rec[:n]
        return cls(n, int((cand & ~rec).sum()), int((rec & ~cand).sum()))

    @property
    def gap(self) -> float:
        return (self.better - self.worse) / self.n if self.n else 0.0

    @property
    def se(self) -> float:
        return math.sqrt(self.better + self.worse + 1) / self.n if self.n else math.inf

    @property
    def lower(self) -> float:
        return self.gap - Z * self.se

    @property
    def upper(self) -> float:
        return self.gap + Z * self.se

    @property
    def z(self) -> float:
        """McNemar z: (c - b) / sqrt(b + c); 0 when no token differs."""
        d = self.better + self.worse
        return (self.better - self.worse) / math.sqrt(d) if d else 0.0

    @property
    def ruled_out(self) -> bool:
        """It cannot beat the recorded layout by MARGIN: no need to score it further."""
        return self.upper < MARGIN

    @property
    def clearly_better(self) -> bool:
        return self.gap >= MARGIN and self.lower >= 0.0

    def tokens_to_settle(self) -> int:
        """About how many tokens settle this comparison if the gap and the rate of
        differing tokens hold: the bound that is short of its threshold reaches it."""
        rate = (self.better + self.worse + 1) / self.n
        room = self.gap if self.gap >= MARGIN else MARGIN - self.gap
        return math.ceil(Z * Z * rate / max(room, 1e-3) ** 2)


@dataclass(frozen=True, slots=True)
class Decision:
    """``best``: index of the layout that fits best (0: the recorded layout itself);
    ``open``: indices of the candidates not ruled out."""

    verdict: str
    best: int
    paired: tuple[Paired | None, ...]   # each layout against the recorded one; None for it
    open: tuple[int, ...]

    @property
    def tokens_to_settle(self) -> int:
        return max((self.paired[i].tokens_to_settle() for i in self.open), default=0)


def decide(hits: Sequence[object], proposed: Sequence[bool] | None = None) -> Decision:
    """The verdict over every layout's hits (bool tensors, the recorded layout first; a
    candidate's may cover only the first tokens of the recorded one's).

    ``proposed`` marks the layouts named for a reason, in the order they were named (the
    fixed candidates, then the search's moves; default: all). The leader is the proposed
    layout with the largest gap over the recorded one, unless another beats it clearly
    (by the rule of MISMATCH): near-equal neighbours the search only tried do not displace
    it by chance. A MISMATCH names the first proposed layout that is clearly better than
    the recorded one and that the leader does not clearly beat: of layouts that fit alike,
    the plainest miswiring, or the search's first stop, not where noise carried it. Every
    layout counts for OK: none may be open."""
    import torch

    proposed = [True] * len(hits) if proposed is None else list(proposed)
    paired = (None, *(Paired.of(h, hits[0]) for h in hits[1:]))

    def gap(i: int) -> float:
        return paired[i].gap if i else 0.0

    best = max((i for i in range(len(hits)) if i == 0 or proposed[i]), key=lambda i: (gap(i), -i))
    rivals = [i for i in range(1, len(hits)) if not proposed[i] and gap(i) > gap(best)
              and Paired.of(hits[i], hits[best]).clearly_better]
    best = max(rivals, key=lambda i: (gap(i), -i), default=best)
    if best and paired[best].clearly_better:
        best = next(i for i in range(1, len(hits)) if (proposed[i] or i == best)
                    and paired[i].clearly_better
                    and not Paired.of(hits[best], hits[i]).clearly_better)
    top1 = [float(torch.as_tensor(h, dtype=torch.float32).mean()) if len(h) else 0.0 for h in hits]
    if max(top1) < WEAK_TOP1:
        return Decision(WEAK, best, paired, ())
    open_ = tuple(i for i in range(1, len(hits)) if not paired[i].ruled_out)
    if best and paired[best].clearly_better:
        verdict = MISMATCH
    else:
        verdict = INCONCLUSIVE if open_ else OK
    return Decision(verdict, best, paired, open_)


Look = Callable[[tuple[int, ...]], "Sequence[object] | None"]


def sequential(hits: Sequence[object], looks: Iterable[Look],
               proposed: Sequence[bool] | None = None) -> tuple[list[object], list[Decision]]:
    """Decide on ``hits`` (the recorded layout first), then, while INCONCLUSIVE, take the
    next look: called with the indices to score (the recorded layout and the open
    candidates), it returns their hits on new tokens (None: no new tokens). Returns every
    layout's hits after the last look and the decision after each look (the last one is
    the verdict). A look is not taken once the verdict is settled."""
    import torch

    hits = list(hits)
    decisions = [decide(hits, proposed)]
    pending = iter(looks)
    while decisions[-1].verdict == INCONCLUSIVE:
        look = next(pending, None)
        if look is None:
            break
        which = (0, *decisions[-1].open)
        new = look(which)
        if new is None:
            continue
        for i, h in zip(which, new, strict=True):
            hits[i] = torch.cat([torch.as_tensor(hits[i], dtype=torch.bool),
                                 torch.as_tensor(h, dtype=torch.bool)])
        decisions.append(decide(hits, proposed))
    return hits, decisions
