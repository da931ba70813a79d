"""`eagle3 eval` without the argument parsing: speculative vs target-only on a prompt set.

For each prompt (rendered with the target's chat template) the target-only
baseline and the speculative engine run back to back in this process, so
machine load drifts hit both alike. The result dict carries SGLang-defined
metrics (see :mod:`eagle3_backend.verify.metrics`) and, at temperature 0,
whether the two outputs are token-for-token identical.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.model import Eagle3DraftModel
from eagle3_backend.verify.datasets import Prompt, render_prompt
from eagle3_backend.verify.engine import SpeculativeEngine, generate_target_only
from eagle3_backend.verify.metrics import (
    acceptance_by_category,
    acceptance_length,
    step_breakdown,
    summarize,
)
from eagle3_backend.verify.targets import Target
from eagle3_backend.verify.tree import SpecSettings

logger = logging.getLogger(__name__)

__all__ = ["evaluate", "at_turn"]


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def at_turn(target: Target, prompts: Sequence[Prompt], turn: int, max_new_tokens: int,
            progress: bool = False) -> tuple[list[Prompt], int]:
    """The prompts as their ``turn``-th user turn (1: as they are): the target answers each
    earlier turn greedily (``max_new_tokens`` at most), and its answer's text goes back into
    the chat before the next follow-up, as a chat client sends it. Returns those prompts and
    how many were skipped for having fewer turns."""
    if turn < 1:
        raise Eagle3Error(f"--turn must be >= 1, got {turn}.")
    if turn == 1:
        return list(prompts), 0
    keep = [p for p in prompts if len(p.follow_ups) >= turn - 1]
    if not keep:
        raise Eagle3Error(f"--turn {turn}: none of the {len(prompts)} prompts has {turn} user "
                          "turns (MT-Bench has 2; a file gives follow-ups in a 'turns' list).")
    out = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(keep) * (turn - 1), desc=f"answers before turn {turn}", unit="answer")
    for p in keep:
        messages = list(p.messages)
        for follow_up in p.follow_ups[:turn - 1]:
            ids = render_prompt(target.tokenizer, Prompt(p.id, tuple(messages)))
            answer = generate_target_only(target, ids, max_new_tokens).tokens
            text = target.tokenizer.decode(answer, skip_special_tokens=True)
            messages += [("assistant", text), ("user", follow_up)]
            if bar is not None:
                bar.update()
        out.append(Prompt(p.id, tuple(messages), p.category, p.follow_ups[turn - 1:]))
    if bar is not None:
        bar.close()
    return out, len(prompts) - len(keep)


def evaluate(
    target: Target,
    draft: Eagle3DraftModel,
    prompts: Sequence[Prompt],
    settings: SpecSettings,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    baseline: bool = True,
    chat_template: bool = True,
    warmup: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Run every prompt through the baseline (optional) and the speculative engine."""
    if max_new_tokens < 1:
        raise Eagle3Error(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    engine = SpeculativeEngine(target, draft, settings)
    encoded = [render_prompt(target.tokenizer, p, chat_template) for p in prompts]
    if warmup and encoded:  # first calls pay one-off allocation / dispatch costs
        generate_target_only(target, encoded[0], 2)
        engine.generate(encoded[0], 2)
    iterator = range(len(prompts))
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc="eval", unit="prompt")
    spec_runs, base_runs, per_prompt = [], [], []
    for i in iterator:
        ids = encoded[i]
        base = (generate_target_only(target, ids, max_new_tokens, temperature, seed)
                if baseline else None)
        spec = engine.generate(ids, max_new_tokens, temperature, seed)
        spec_runs.append(spec)
        if base is not None:
            base_runs.append(base)
        row: dict[str, Any] = {
            "id": prompts[i].id,
            **({"category": prompts[i].category} if prompts[i].category else {}),
            "prompt_tokens": len(ids),
            "completion_tokens": spec.completion_tokens,
            "verify_steps": spec.verify_steps,
            "acceptance_length": acceptance_length(spec.completion_tokens, spec.verify_steps),
            "seconds": spec.seconds,
        }
        if base is not None:
            row["baseline_completion_tokens"] = base.completion_tokens
            row["baseline_seconds"] = base.seconds
            if temperature == 0:
                row["identical"] = spec.tokens == base.tokens
                row["first_difference"] = _first_difference(spec.tokens, base.tokens)
        per_prompt.append(row)

    metrics = summarize(
        [r.completion_tokens for r in spec_runs], [r.seconds for r in spec_runs],
        [r.accepted_per_step for r in spec_runs], settings.speculative_num_steps,
        [r.completion_tokens for r in base_runs] if baseline else None,
        [r.seconds for r in base_runs] if baseline else None,
    )
    result = metrics.to_dict()
    result["step_ms"] = step_breakdown(
        [r.phases for r in spec_runs], metrics.verify_steps,
        [r.phases for r in base_runs] if baseline else None,
        [r.completion_tokens for r in base_runs] if baseline else None)
    compared = [row["identical"] for row in per_prompt if "identical" in row]
    result["outputs_identical"] = all(compared) if compared else None
    result["agreement_rate"] = sum(compared) / len(compared) if compared else None
    result["temperature"] = temperature
    result["max_new_tokens"] = max_new_tokens
    result["settings"] = settings.to_dict()
    result["dtype"] = str(target.dtype).removeprefix("torch.")
    result["layout"] = str(draft.config.layout)
    result["acceptance_by_category"] = acceptance_by_category(
        (row.get("category"), row["completion_tokens"], row["verify_steps"]) for row in per_prompt)
    result["per_prompt"] = per_prompt
    return result
