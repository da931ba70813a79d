"""The target's states captured once, and the draft scored on them under any layout.

:func:`collect_states` runs the target over prompts and its own greedy answers,
capturing every residual-stream state (``embed``, ``layer_input:1`` ..
``layer_input:L``); :class:`Scorer` runs the draft's first speculative step with the
fc input of a layout built from them, and reports which answer tokens its top-1 gets
right (the target's greedy next token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eagle3_backend.layout import Layout

ACCEPT_STEPS = 3   # TTT steps behind the expected chain acceptance length


@dataclass(slots=True)
class Score:
    """``hits`` [scored] bool: which scored tokens the draft got right, in the same order
    for every layout (a layout scored on fewer prompts covers the first tokens only)."""

    layout: Layout
    why: str
    hits: torch.Tensor
    vs_recorded: Any = None   # a verdict.Paired once judged (None for the recorded layout)

    @property
    def correct(self) -> int:
        return int(self.hits.sum())

    @property
    def scored(self) -> int:
        return int(self.hits.numel())

    @property
    def top1(self) -> float:
        return self.correct / self.scored if self.scored else 0.0

    def extend(self, hits: torch.Tensor) -> None:
        self.hits = torch.cat([self.hits, hits])

    def as_dict(self) -> dict[str, Any]:
        out = {"layout": self.layout.to_strings(), "why": self.why, "top1": round(self.top1, 4),
               "correct": self.correct, "scored": self.scored}
        if self.vs_recorded is not None:
            p = self.vs_recorded
            out["vs_recorded"] = {"gap": round(p.gap, 4), "lower": round(p.lower, 4),
                                  "upper": round(p.upper, 4), "z": round(p.z, 2)}
        return out


class Scorer:
    """The draft run over captured states with the fc input of any layout.

    sequences: DataSequence-like (tokens [L], prompt_len, aux [L-1, len(all_sources)*H]
    holding every source of ``all_sources``). Rows scored at TTT step j: answer
    positions i whose token x_{i+2+j} is known, as ``eagle3 train`` scores them.
    """

    def __init__(self, draft: Any, sequences: Sequence[Any], all_sources: Layout,
                 ttt_steps: int = 1, batch_tokens: int = 2048) -> None:
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


def all_sources(num_layers: int) -> Layout:
    """[embed, layer_input:1, .., layer_input:num_layers]: every state a layout can name."""
    return Layout.of_layers(range(num_layers + 1))


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
