"""Speculative-decoding metrics, defined as SGLang defines them.

* acceptance length = completion tokens / verify steps: the tokens one target
  verify forward commits on average, the bonus token included (SGLang's
  ``meta_info.spec_accept_length = completion_tokens / spec_verify_ct``; like
  SGLang, the first token, which the prefill commits, is counted).
* acceptance rate at draft position i (1-based) = share of verify steps that
  accepted at least i draft tokens.
* histogram[j] = number of verify steps that accepted exactly j draft tokens
  (SGLang's ``spec_correct_drafts_histogram``).
* tok/s = completion tokens / wall seconds (prefill included), summed over
  requests; speedup = speculative tok/s / target-only tok/s, same prompts,
  same process.
* step cost (this project's, offline only) = milliseconds of a verify step (draft +
  target verify forward + acceptance) / milliseconds of a target-only decode step: away
  from the prefills, speedup = acceptance length / step cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The phases of one verify step, in order (the offline engine times each): the draft (extend
# and tree), the target's forward over the tree, the acceptance with its KV rollback.
STEP_PHASES = ("draft", "verify", "accept")

__all__ = [
    "STEP_PHASES",
    "SpecMetrics",
    "acceptance_by_category",
    "acceptance_histogram",
    "acceptance_length",
    "acceptance_rate_by_position",
    "step_breakdown",
    "summarize",
]


def acceptance_length(completion_tokens: int, verify_steps: int) -> float | None:
    """completion tokens / verify steps; None when nothing was verified."""
    if verify_steps < 0 or completion_tokens < 0:
        raise ValueError(f"counts must be >= 0, got {completion_tokens} tokens, {verify_steps} steps")
    return completion_tokens / verify_steps if verify_steps else None


def acceptance_by_category(rows: Iterable[tuple[str | None, int, int]]) -> dict[str, dict] | None:
    """Acceptance length of each prompt category, pooled (its tokens / its verify steps), with
    its prompt count, in name order, from (category or None, completion tokens, verify steps)
    rows; None when no row names a category."""
    pooled: dict[str, list[int]] = {}
    for category, tokens, steps in rows:
        if category:
            tally = pooled.setdefault(category, [0, 0, 0])
            tally[0] += 1
            tally[1] += tokens
            tally[2] += steps
    return {name: {"prompts": n, "acceptance_length": acceptance_length(tokens, steps)}
            for name, (n, tokens, steps) in sorted(pooled.items())} or None


def acceptance_histogram(accepted_per_step: Sequence[int], num_positions: int) -> list[int]:
    """hist[j] = steps that accepted exactly j draft tokens, j = 0..num_positions."""
    hist = [0] * (num_positions + 1)
    for a in accepted_per_step:
        if not 0 <= a <= num_positions:
            raise ValueError(f"a step accepted {a} draft tokens; expected 0..{num_positions}")
        hist[a] += 1
    return hist


def acceptance_rate_by_position(accepted_per_step: Sequence[int], num_positions: int) -> list[float | None]:
    """rate[i-1] = share of steps that accepted >= i draft tokens, i = 1..num_positions
    (None for every position when there were no steps)."""
    hist = acceptance_histogram(accepted_per_step, num_positions)
    steps = len(accepted_per_step)
    if steps == 0:
        return [None] * num_positions
    rates = []
    at_least = steps
    for i in range(1, num_positions + 1):
        at_least -= hist[i - 1]
        rates.append(at_least / steps)
    return rates


@dataclass(frozen=True, slots=True)
class SpecMetrics:
    """Aggregate over a set of requests."""

    n_prompts: int
    completion_tokens: int
    verify_steps: int
    acceptance_length: float | None
    acceptance_rate_by_position: list[float | None]
    acceptance_histogram: list[int]
    tokens_per_s: float
    baseline_tokens_per_s: float | None
    speedup: float | None

    def to_dict(self) -> dict:
        return {
            "n_prompts": self.n_prompts,
            "completion_tokens": self.completion_tokens,
            "verify_steps": self.verify_steps,
            "acceptance_length": self.acceptance_length,
            "acceptance_rate_by_position": self.acceptance_rate_by_position,
            "acceptance_histogram": self.acceptance_histogram,
            "tokens_per_s": self.tokens_per_s,
            "baseline_tokens_per_s": self.baseline_tokens_per_s,
            "speedup": self.speedup,
        }


def summarize(
    completion_tokens: Sequence[int],
    seconds: Sequence[float],
    accepted_per_step: Sequence[Sequence[int]],
    num_positions: int,
    baseline_tokens: Sequence[int] | None = None,
    baseline_seconds: Sequence[float] | None = None,
) -> SpecMetrics:
    """Metrics over requests (one entry per request in each sequence)."""
    steps = [a for per_req in accepted_per_step for a in per_req]
    total_tokens = sum(completion_tokens)
    total_s = sum(seconds)
    tps = total_tokens / total_s if total_s > 0 else 0.0
    base_tps = None
    if baseline_tokens is not None and baseline_seconds is not None:
        bs = sum(baseline_seconds)
        base_tps = sum(baseline_tokens) / bs if bs > 0 else None
    return SpecMetrics(
        n_prompts=len(completion_tokens),
        completion_tokens=total_tokens,
        verify_steps=len(steps),
        acceptance_length=acceptance_length(total_tokens, len(steps)),
        acceptance_rate_by_position=acceptance_rate_by_position(steps, num_positions),
        acceptance_histogram=acceptance_histogram(steps, num_positions),
        tokens_per_s=tps,
        baseline_tokens_per_s=base_tps,
        speedup=(tps / base_tps) if base_tps else None,
    )


def step_breakdown(spec_phases: Sequence[dict[str, float]], verify_steps: int,
                   baseline_phases: Sequence[dict[str, float]] | None = None,
                   baseline_tokens: Sequence[int] | None = None) -> dict[str, float | None]:
    """Milliseconds a verify step spends in each of :data:`STEP_PHASES`, their sum ``step``,
    the speculative ``prefill`` a request; with the target-only runs (their phases and
    completion tokens: every token after the first is one decode forward) also ``decode`` a
    token, the ``baseline_prefill`` and the ``step_cost`` in decode steps. A figure that has
    nothing to average is None."""
    def per(total: float, count: int) -> float | None:
        return 1000 * total / count if count else None

    out: dict[str, float | None] = {
        name: per(sum(p.get(name, 0.0) for p in spec_phases), verify_steps) for name in STEP_PHASES}
    out["step"] = None if verify_steps == 0 else sum(out[n] for n in STEP_PHASES)
    out["prefill"] = per(sum(p.get("prefill", 0.0) for p in spec_phases), len(spec_phases))
    if baseline_phases is not None and baseline_tokens is not None:
        decodes = sum(max(0, t - 1) for t in baseline_tokens)
        out["decode"] = per(sum(p.get("decode", 0.0) for p in baseline_phases), decodes)
        out["baseline_prefill"] = per(sum(p.get("prefill", 0.0) for p in baseline_phases),
                                      len(baseline_phases))
        out["step_cost"] = (out["step"] / out["decode"]
                            if out["step"] is not None and out["decode"] else None)
    return out
