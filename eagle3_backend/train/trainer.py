"""EAGLE-3 draft training with training-time test (TTT).

Row ``i`` of a sequence pairs token ``x_{i+1}`` with the target's layout states
at ``i`` and predicts ``x_{i+2}``, as the verifier and SGLang draft
(:mod:`eagle3_backend.verify.tree`). TTT unrolls ``ttt_steps`` draft steps the
way drafting runs them: step ``j`` feeds row ``i`` the token ``x_{i+1+j}``, the
draft's *own* hidden from step ``j-1`` and rotary position ``i + j``, and its
attention sees the step-0 keys of rows ``<= i`` plus row ``i``'s keys of steps
``1..j`` (the drafted chain above a committed prefix)::

    keys:       step 0 (T)   step 1 (T)  ...  step j (T)
    step j, i:  [0..i]       [i]              [i]

The loss at step ``j`` is the cross-entropy between the draft's distribution
and the target's next-token distribution at position ``i+1+j`` restricted to
the draft vocabulary (recomputed from the stored final-normed hidden state),
on answer rows (``i >= prompt_len - 1``) whose target token is in the draft
vocabulary, weighted ``step_weight ** j``. Top-1 accuracy counts a row right
when the draft's argmax, mapped to a target id, is the target's greedy token
``x_{i+2+j}``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F

from eagle3_backend.config import DraftConfig
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout
from eagle3_backend.model import Eagle3DraftModel
from eagle3_backend.train.data import DataSequence, TrainingData
from eagle3_backend.train.vocab import VocabMap

logger = logging.getLogger(__name__)

__all__ = [
    "Batch",
    "TrainResult",
    "TrainSettings",
    "build_draft",
    "evaluate_top1",
    "make_batches",
    "reorder_layout",
    "split_heldout",
    "train_draft",
    "ttt_forward",
    "to_topk",
    "ttt_loss",
]


@dataclass(frozen=True, slots=True)
class TrainSettings:
    """Optimisation settings; ``steps=None`` trains ``epochs`` passes over the data."""

    ttt_steps: int = 3
    steps: int | None = None
    epochs: float = 3.0
    batch_tokens: int = 512
    lr: float = 2e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    step_weight: float = 0.8
    prompt_weight: float = 0.0
    heldout_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("ttt_steps", "batch_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise Eagle3Error(f"TrainSettings.{name} must be an integer >= 1, got {v!r}.")
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int)
                                       or self.steps < 1):
            raise Eagle3Error(f"TrainSettings.steps must be None or an integer >= 1, got {self.steps!r}.")
        if not self.epochs > 0 or not self.lr > 0:
            raise Eagle3Error(f"epochs ({self.epochs}) and lr ({self.lr}) must be > 0.")
        if not 0 <= self.heldout_fraction < 1:
            raise Eagle3Error(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}.")
        if not 0 <= self.prompt_weight <= 1:
            raise Eagle3Error(f"prompt_weight must be in [0, 1], got {self.prompt_weight}.")
        if not 0 < self.step_weight <= 1 or not 0 <= self.min_lr_ratio <= 1:
            raise Eagle3Error(f"step_weight ({self.step_weight}) must be in (0, 1] and "
                              f"min_lr_ratio ({self.min_lr_ratio}) in [0, 1].")


# --------------------------------------------------------------------------- model
def build_draft(config: DraftConfig, data: TrainingData, vocab: VocabMap,
                seed: int = 0) -> Eagle3DraftModel:
    """An fp32 draft ready to train: seeded random weights
    (:meth:`Eagle3DraftModel.init_random`), the frequency vocab map, and the target's
    embedding shared (frozen: serving takes it from the target too).

    (Starting lm_head and the final norm from the target's rows was tried on
    SmolLM2-135M: its large initial logits made early training slower.)"""
    if config.has_embed_tokens:
        raise Eagle3Error("eagle3 train writes drafts that take the target's embedding; "
                          "build the DraftConfig with has_embed_tokens=False.")
    if config.vocab_size != data.vocab_size or config.target_hidden_size != data.hidden_size:
        raise Eagle3Error(
            f"draft config vocab {config.vocab_size} / target hidden {config.target_hidden_size} "
            f"do not match the data's target ({data.vocab_size} / {data.hidden_size}). "
            "Use data generated with this target (delete a stale --cache-data folder)."
        )
    if config.layout != data.layout:
        raise Eagle3Error(f"draft layout {config.layout} differs from the data's layout "
                          f"{data.layout}; the data was captured for another layout. "
                          "Regenerate the data (or drop --layout).")
    model = Eagle3DraftModel.init_random(dataclasses.replace(config, dtype="float32"), seed=seed)
    model.set_vocab_map(vocab.target_ids)
    model.set_target_embedding(data.embed)
    return model


class _GrowingKV:
    """Draft K/V kept by concatenation (autograd-safe), the cache TTT attends through."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)   # [B, Hkv, L+T, D]
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.length += k.shape[2]
        return self.k, self.v


def ttt_mask(T: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """bool [1, T, T*(step+1)]: causal over step-0 keys, then row i's own key per later step."""
    blocks = [torch.ones(T, T, dtype=torch.bool, device=device).tril()]
    eye = torch.eye(T, dtype=torch.bool, device=device)
    blocks += [eye] * step
    return torch.cat(blocks, dim=1)[None]


# --------------------------------------------------------------------------- batches
@dataclass(slots=True)
class Batch:
    """Right-padded sequences. T = rows (positions with states), S = TTT steps.

    tokens [B, T+S+1] (x_0 ..), aux [B, T, K*H], lengths [B] (tokens per sequence),
    prompt_lens [B], labels [B, T+S] (the target's choice after each position, -1 past
    the end), assistant [B, T+S+1] bool (assistant tokens). The teacher: final
    [B, T+S, H] (zero-padded) or topk_idx / topk_p [B, T+S, k] (draft ids, probabilities).
    """

    tokens: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor | None
    lengths: torch.Tensor
    prompt_lens: torch.Tensor
    labels: torch.Tensor | None = None
    assistant: torch.Tensor | None = None
    topk_idx: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.aux.shape[0] * self.aux.shape[1])


def collate(seqs: Sequence[DataSequence], ttt_steps: int) -> Batch:
    T = max(s.aux.shape[0] for s in seqs)
    B, S = len(seqs), ttt_steps
    KH = seqs[0].aux.shape[1]
    use_final = all(s.final is not None for s in seqs)
    if not use_final and any(s.topk_idx is None for s in seqs):
        raise Eagle3Error("a batch mixes sequences with final states and sequences with "
                          "top-k teachers only; convert them to top-k first (to_topk).")
    tokens = torch.zeros(B, T + S + 1, dtype=torch.long)
    aux = torch.zeros(B, T, KH)
    labels = torch.full((B, T + S), -1, dtype=torch.long)
    assistant = torch.zeros(B, T + S + 1, dtype=torch.bool)
    final = topk_idx = topk_p = None
    if use_final:
        final = torch.zeros(B, T + S, seqs[0].final.shape[1])
    else:
        k = seqs[0].topk_idx.shape[1]
        topk_idx = torch.zeros(B, T + S, k, dtype=torch.long)
        topk_p = torch.zeros(B, T + S, k)
    for b, s in enumerate(seqs):
        L = s.tokens.shape[0]
        tokens[b, :L] = s.tokens
        aux[b, :L - 1] = s.aux.float()
        labels[b, :L - 1] = s.label_ids()
        assistant[b, :L] = s.assistant_mask()
        if final is not None:
            final[b, :L - 1] = s.final.float()
        else:
            topk_idx[b, :L - 1] = s.topk_idx.long()
            topk_p[b, :L - 1] = s.topk_p.float()
    return Batch(tokens, aux, final,
                 torch.tensor([s.tokens.shape[0] for s in seqs]),
                 torch.tensor([s.prompt_len for s in seqs]),
                 labels, assistant, topk_idx, topk_p)


def to_topk(seqs: Sequence[DataSequence], head: torch.Tensor, k: int,
            chunk: int = 4096) -> list[DataSequence]:
    """Sequences whose teacher is ``final`` states turned into top-``k`` teachers over the
    draft vocabulary (``head`` [Vd, H]: the target lm_head rows of the draft vocabulary),
    as the teacher-forced data stores them (probabilities of the full draft-vocabulary
    softmax, fp16), so both kinds of data can share batches."""
    out = []
    for s in seqs:
        if s.final is None:
            out.append(s)
            continue
        idx, prob = [], []
        for i in range(0, s.final.shape[0], chunk):
            p = torch.softmax(s.final[i:i + chunk].float() @ head.T, dim=-1)
            v, ix = p.topk(k, dim=-1)
            idx.append(ix.to(torch.int32))
            prob.append(v.to(torch.float16))
        out.append(dataclasses.replace(s, final=None, labels=s.label_ids(),
                                       assistant=s.assistant_mask(),
                                       topk_idx=torch.cat(idx), topk_p=torch.cat(prob)))
    return out


def make_batches(seqs: Sequence[DataSequence], batch_tokens: int, ttt_steps: int,
                 rng: random.Random | None = None) -> list[Batch]:
    """Length-sorted groups of at most ``batch_tokens`` padded rows (at least one
    sequence each), in a shuffled order when ``rng`` is given."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].aux.shape[0])
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        T = seqs[i].aux.shape[0]
        if cur and (len(cur) + 1) * T > batch_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    if rng is not None:
        rng.shuffle(groups)
    return [collate([seqs[i] for i in g], ttt_steps) for g in groups]


def reorder_layout(seqs: Sequence[DataSequence], src: Layout, dst: Layout) -> list[DataSequence]:
    """The sequences with their aux chunks moved from layout ``src`` order to ``dst``
    order (the same sources; a checkpoint is written in layer order)."""
    if sorted(map(str, src.sources)) != sorted(map(str, dst.sources)):
        raise Eagle3Error(f"layouts {src} and {dst} name different sources; only the order "
                          "of the same sources can be changed.")
    if src == dst:
        return list(seqs)
    idx = [src.sources.index(x) for x in dst.sources]
    out = []
    for s in seqs:
        chunks = s.aux.split(s.aux.shape[1] // len(src), dim=-1)
        out.append(dataclasses.replace(s, aux=torch.cat([chunks[i] for i in idx], dim=-1)))
    return out


def split_heldout(seqs: Sequence[DataSequence], fraction: float,
                  seed: int) -> tuple[list[DataSequence], list[DataSequence]]:
    """(train, held-out) by sequence, seeded; at least one held-out sequence when
    fraction > 0 and there are two or more sequences."""
    n = len(seqs)
    k = 0 if fraction <= 0 or n < 2 else min(n - 1, max(1, round(fraction * n)))
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    held = set(perm[:k])
    return ([s for i, s in enumerate(seqs) if i not in held],
            [s for i, s in enumerate(seqs) if i in held])


# --------------------------------------------------------------------------- loss
@dataclass(slots=True)
class StepStats:
    """Per TTT step: summed loss, rows with loss, rows scored for top-1, rows right; and,
    when counted (``ttt_loss(..., chain=True)``), the answers decoded as a greedy chain of
    the TTT steps' drafts: answer tokens and verify steps (:func:`chain_counts`)."""

    loss: list[float]
    loss_rows: list[int]
    rows: list[int]
    correct: list[int]
    chain_tokens: int = 0
    chain_steps: int = 0

    @classmethod
    def zeros(cls, steps: int) -> "StepStats":
        return cls([0.0] * steps, [0] * steps, [0] * steps, [0] * steps)

    def add(self, other: "StepStats") -> None:
        for name in ("loss", "loss_rows", "rows", "correct"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for j in range(len(mine)):
                mine[j] += theirs[j]
        self.chain_tokens += other.chain_tokens
        self.chain_steps += other.chain_steps

    def as_tuple(self) -> tuple:
        """What a checkpoint stores (``StepStats(*t)`` reads it back)."""
        return (self.loss, self.loss_rows, self.rows, self.correct, self.chain_tokens,
                self.chain_steps)

    def top1(self) -> list[float | None]:
        return [c / r if r else None for c, r in zip(self.correct, self.rows)]

    def chain_acceptance(self) -> float | None:
        """Answer tokens per verify step of the simulated chain (SGLang's accept length:
        the prefill's first token counts, a step's bonus token too); None when no
        sequence could be decoded (no answer is the target's own greedy text)."""
        return self.chain_tokens / self.chain_steps if self.chain_steps else None

    def mean_loss(self) -> list[float | None]:
        return [l / r if r else None for l, r in zip(self.loss, self.loss_rows)]


def ttt_forward(model: Eagle3DraftModel, tokens: torch.Tensor, aux: torch.Tensor,
                ttt_steps: int) -> Iterator[torch.Tensor]:
    """The draft's final-normed hidden [B, T, H] of each TTT step, step 0 first
    (``normed @ model.head_weight.T`` are the step's draft-vocab logits).

    tokens [B, >= T+S] (x_0 ..), aux [B, T, K*H] target states of rows 0..T-1.
    Step j, row i: token x_{i+1+j}, rotary position i+j, hidden = the target states
    (j = 0) or the draft's own output of step j-1 at row i. The body is
    :meth:`Eagle3DraftModel.forward` without the lm_head, so the caller projects only
    the rows it scores (tests/train check the two agree).
    """
    B, T = aux.shape[:2]
    rows = torch.arange(T, device=aux.device)[None]                     # [1, T]
    caches = [_GrowingKV() for _ in range(model.config.num_hidden_layers)]
    hidden = model.project(aux)                                         # [B, T, H]
    emb = model.embedding_weight
    for j in range(ttt_steps):
        ids = tokens[:, 1 + j: 1 + j + T]                               # [B, T] x_{i+1+j}
        embeds = F.embedding(ids, emb).to(hidden.dtype)
        out = model.decoder(embeds, hidden, (rows + j).expand(B, T), caches,
                            ttt_mask(T, j, aux.device))                 # [B, T, H]
        normed = model.norm(out)
        hidden = normed if model.config.norm_output else out
        yield normed


def ttt_loss(model: Eagle3DraftModel, batch: Batch, vocab: VocabMap, head: torch.Tensor,
             ttt_steps: int, step_weight: float = 0.8, prompt_weight: float = 0.0,
             chain: bool = False) -> tuple[torch.Tensor, StepStats]:
    """Weighted TTT loss of one batch and its per-step statistics.

    ``head`` [Vd, H]: the target lm_head rows of the draft vocabulary (teacher).
    Answer rows with a known next token are scored; with ``prompt_weight`` > 0 the
    prompt rows also carry loss (the target's distribution over the user's text),
    weighted so. Statistics count answer rows only. Only rows with loss or a score
    reach either lm_head. ``chain``: also count the simulated chain (:func:`chain_counts`).
    """
    B, T = batch.aux.shape[:2]
    device = batch.aux.device
    if batch.labels is None or batch.assistant is None:
        raise Eagle3Error("batch without labels / assistant mask: build it with collate().")
    fed_answer = batch.assistant[:, 1:1 + T]                            # [B, T] x_{i+1} assistant
    t2d, target_ids = vocab.t2d.to(device), vocab.target_ids.to(device)
    draft_head = model.head_weight
    total = batch.aux.new_zeros(())
    stats = StepStats.zeros(ttt_steps)
    right_rows = ([torch.zeros(B, T, dtype=torch.bool, device=device) for _ in range(ttt_steps)]
                  if chain else None)                                   # [B, T] drafted right
    for j, normed in enumerate(ttt_forward(model, batch.tokens, batch.aux, ttt_steps)):
        target_tok = batch.labels[:, 1 + j: 1 + j + T]                  # [B, T] choice at i+1+j
        known = target_tok >= 0                                         # [B, T]
        answer = fed_answer & batch.assistant[:, 2 + j: 2 + j + T]      # it chooses x_{i+2+j}
        picked = known if prompt_weight > 0 else answer & known
        if not bool(picked.any()):
            continue
        logits = normed[picked] @ draft_head.T.to(normed.dtype)         # [R, Vd]
        tok = target_tok[picked]                                        # [R]
        is_answer = answer[picked]                                      # [R]
        use = t2d[tok]                                                  # [R] loss rows
        if bool(use.any()):
            logp = torch.log_softmax(logits[use].float(), dim=-1)
            with torch.no_grad():
                w = torch.where(is_answer[use], 1.0, prompt_weight)     # [U]
                if batch.final is not None:
                    teacher = torch.softmax(batch.final[:, 1 + j: 1 + j + T][picked][use] @ head.T,
                                            dim=-1)                     # [U, Vd]
                else:
                    idx = batch.topk_idx[:, 1 + j: 1 + j + T][picked][use]          # [U, k]
                    p = batch.topk_p[:, 1 + j: 1 + j + T][picked][use]              # [U, k]
                    p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
            if batch.final is not None:
                ce = -(teacher * logp).sum(-1)                          # [U]
            else:
                ce = -(p * logp.gather(-1, idx)).sum(-1)                # [U]
            step_loss = (ce * w).sum() / w.sum()
            total = total + (step_weight ** j) * step_loss
            on_answer = is_answer[use]
            stats.loss[j] = float(ce[on_answer].detach().sum())
            stats.loss_rows[j] = int(on_answer.sum())
        with torch.no_grad():
            stats.rows[j] = int(is_answer.sum())
            right = target_ids[logits.argmax(dim=-1)] == tok
            stats.correct[j] = int((right & is_answer).sum())
            if right_rows is not None:
                right_rows[j][picked] = right & is_answer
    if right_rows is not None:
        stats.chain_tokens, stats.chain_steps = chain_counts(batch, right_rows)
    return total, stats


def chain_counts(batch: Batch, right_rows: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(answer tokens, verify steps) of greedy chain speculation replayed on ``batch``.

    ``right_rows[j]`` [B, T]: whether TTT step ``j`` at row ``i`` drafts the target's
    token ``x_{i+2+j}``. Step ``j`` at row ``i`` computes exactly what drafting computes
    after a verify step that committed ``x_{i+1}`` and accepted the drafts before it
    (the module docstring), so on an answer that is the target's own greedy text the
    chain of ``S`` drafts is replayed exactly: the first answer token comes from the
    prefill; a verify step at row ``i`` accepts the run ``a`` of right steps there and
    adds the bonus token, and the next starts at row ``i + a + 1``. Counted only for
    sequences whose answer is one block at the end that the labels reproduce token for
    token (generated answers; teacher-forced text is skipped). Unlike the product of
    per-step top-1s, this keeps where the right rows fall: hard stretches cost a
    verify step a token, easy ones several tokens a step."""
    right = torch.stack(right_rows, dim=-1).cpu()                       # [B, T, S]
    tokens_, steps_ = 0, 0
    toks, labels, assistant = batch.tokens.cpu(), batch.labels.cpu(), batch.assistant.cpu()
    for b in range(toks.shape[0]):
        L, p = int(batch.lengths[b]), int(batch.prompt_lens[b])
        if not 0 < p < L or not bool(assistant[b, p:L].all()) or bool(assistant[b, :p].any()):
            continue
        if not torch.equal(labels[b, p - 1:L - 1], toks[b, p:L]):
            continue
        run = right[b].cumprod(dim=-1).sum(dim=-1).tolist()           # [T] accepted at row i
        i, steps = p - 1, 0
        while i + 2 <= L - 1:
            steps += 1
            i += int(run[i]) + 1
        tokens_ += L - p
        steps_ += steps
    return tokens_, steps_


@torch.no_grad()
def evaluate_top1(model: Eagle3DraftModel, batches: Sequence[Batch], vocab: VocabMap,
                  head: torch.Tensor, ttt_steps: int) -> StepStats:
    """Top-1 accuracy and loss per TTT step over ``batches``, and the simulated chain
    (:func:`chain_counts`), no gradient."""
    was = model.training
    model.eval()
    stats = StepStats.zeros(ttt_steps)
    for b in batches:
        _, s = ttt_loss(model, b, vocab, head, ttt_steps, chain=True)
        stats.add(s)
    model.train(was)
    return stats


def expected_acceptance_length(top1: Sequence[float | None]) -> float | None:
    """1 + a0 + a0*a1 + ...: the chain acceptance length if step accuracies were independent.

    They are not: right rows cluster in easy stretches, so this overstates what serving
    accepts (the shipped SmolLM2 draft: 1.99 from held-out top-1, 1.61-1.68 served).
    :meth:`StepStats.chain_acceptance` replays the chain instead, where the data allows."""
    if any(a is None for a in top1):
        return None
    total, run = 1.0, 1.0
    for a in top1:
        run *= a
        total += run
    return total


def heldout_score(stats: StepStats) -> tuple[float, float]:
    """What the best held-out weights maximise, in order: the replayed chain's acceptance
    length when the held-out answers are the target's own text (else the independence
    estimate), then the independence estimate (it breaks the replay's ties on few answers)."""
    expected = expected_acceptance_length(stats.top1()) or 0.0
    sim = stats.chain_acceptance()
    return (sim if sim is not None else expected, expected)


# --------------------------------------------------------------------------- training
@dataclass(slots=True)
class TrainResult:
    model: Eagle3DraftModel
    steps_done: int
    steps_planned: int               # before any shrinking to fit the deadline
    stopped_by_deadline: bool
    seconds: float
    train_rows: int                  # answer tokens
    heldout_rows: int
    train_stats: StepStats           # over the last epoch's worth of steps
    heldout_stats: StepStats | None  # of the returned (best) weights
    loss_curve: list[tuple[int, float]]
    heldout_curve: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best_step: int | None = None     # the returned weights are from after this step
    finished: bool = True            # False: stopped by the deadline with a checkpoint to resume
    resumed_from: int | None = None  # the step a checkpoint resumed at


def _lr_at(step: int, total: int, s: TrainSettings) -> float:
    warm = min(s.warmup_steps, max(1, total // 10))
    if step < warm:
        return s.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


CHECKPOINT_NAME = "state.pt"


def _save_checkpoint(directory: Any, state: dict[str, Any]) -> None:
    """``state.pt`` written to a temporary name, flushed to disk and renamed; then
    ``checkpoint.json`` (step, total: for people and tests) the same way."""
    import json
    import os
    from pathlib import Path

    from eagle3_backend.verify.report import write_text_atomic

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (CHECKPOINT_NAME + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(d / CHECKPOINT_NAME)
    write_text_atomic(d / "checkpoint.json", json.dumps(
        {"step": state["step"], "total": state["total"], "finished": state["finished"]}) + "\n")


def load_checkpoint(directory: Any, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The state saved by a run with the same ``identity``; None when there is none;
    an error naming the difference when the folder belongs to another run."""
    from pathlib import Path

    path = Path(directory) / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same problem
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Eagle3Error(f"{path}: not a readable checkpoint (tensors and plain values only, "
                          f"never pickled code: {first}); delete it to start the run over.") from None
    theirs = state.get("identity", {})
    diff = [k for k in sorted(set(identity) | set(theirs)) if identity.get(k) != theirs.get(k)]
    if diff:
        lines = "; ".join(f"{k}: checkpoint has {theirs.get(k)!r}, this run {identity.get(k)!r}"
                          for k in diff)
        raise Eagle3Error(f"checkpoint {path} belongs to another run ({lines}). Use another "
                          "--checkpoint-dir, or delete it to start over.")
    return state


def train_draft(model: Eagle3DraftModel, train: Sequence[DataSequence],
                heldout: Sequence[DataSequence], vocab: VocabMap, lm_head: torch.Tensor | None,
                settings: TrainSettings, deadline: float | None = None,
                progress: bool = False, checkpoint_dir: Any = None,
                checkpoint_every: int = 100, eval_every: int | None = None,
                identity: dict[str, Any] | None = None) -> TrainResult:
    """AdamW with warm-up and cosine decay over ``settings.steps`` batches (epochs of
    shuffled length-bucketed batches). With held-out data, the held-out top-1 is measured
    after every epoch, every ``eval_every`` steps and at the end, and the weights with the
    best held-out acceptance (:func:`heldout_score`) are returned (a guard against over-fitting).

    Without ``checkpoint_dir``, a ``deadline`` shrinks the planned steps to what the
    measured step time fits before it (the schedule still decays fully). With it, the
    schedule is fixed; the whole training state (weights, AdamW moments, step, the
    epoch's shuffle state and position in it, torch RNG, best weights, curves) is saved
    atomically every ``checkpoint_every`` steps, at the deadline and at the end, and a
    run with the same ``identity`` continues from it: the result equals an uninterrupted
    run's exactly (one thread). A run stopped by the deadline returns ``finished=False``.
    ``lm_head`` may be None when every sequence carries a top-k teacher."""
    if not train:
        raise Eagle3Error("no training sequences: every answer was held out or empty. "
                          "Use more prompts (--num-prompts).")
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    head = lm_head[vocab.target_ids].float() if lm_head is not None else None   # [Vd, H]
    S = settings.ttt_steps
    epoch_state = rng.getstate()
    epoch = make_batches(train, settings.batch_tokens, S, rng)
    per_epoch = len(epoch)
    consumed = 0                                                        # of this epoch
    total = planned = settings.steps or max(1, math.ceil(settings.epochs * per_epoch))
    held_batches = make_batches(heldout, settings.batch_tokens, S) if heldout else []
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95),
                            weight_decay=settings.weight_decay)
    window: list[StepStats] = []
    curve: list[tuple[int, float]] = []
    held_curve: list[dict[str, Any]] = []
    best: tuple[tuple[float, float], int, dict[str, torch.Tensor], StepStats] | None = None
    step, elapsed_before = 0, 0.0
    identity = {**(identity or {}), "settings": dataclasses.asdict(settings),
                "train_sequences": len(train), "heldout_sequences": len(heldout)}
    resumed_from = None
    if checkpoint_dir is not None:
        st = load_checkpoint(checkpoint_dir, identity)
        if st is not None:
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
            step, total, consumed = st["step"], st["total"], st["consumed"]
            rng.setstate(st["epoch_state"])
            epoch_state = st["epoch_state"]
            epoch = make_batches(train, settings.batch_tokens, S, rng)
            del epoch[len(epoch) - consumed:]                           # popped from the end
            torch.set_rng_state(st["torch_rng"])
            window = [StepStats(*w) for w in st["window"]]
            curve, held_curve = st["curve"], st["held_curve"]
            if st["best"] is not None:
                sc, bs, bstate, bst = st["best"]
                sc = tuple(sc) if isinstance(sc, (tuple, list)) else (sc, sc)   # older: one float
                best = (sc, bs, bstate, StepStats(*bst))
            elapsed_before = st["elapsed"]
            resumed_from = step
            logger.info("resuming training from step %d of %d (%s)", step, total, checkpoint_dir)
    model.train()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=step, desc="train", unit="step", smoothing=0.05)

    def check_heldout() -> None:
        nonlocal best
        if not held_batches or (held_curve and held_curve[-1]["step"] == step):
            return
        st = evaluate_top1(model, held_batches, vocab, head, S)
        score = heldout_score(st)
        held_curve.append({"step": step, "epoch": round(step / per_epoch, 2),
                           "top1_by_position": [None if a is None else round(a, 4)
                                                for a in st.top1()],
                           "expected_acceptance_length": round(score[1], 4),
                           "chain_acceptance_length": (None if st.chain_acceptance() is None
                                                       else round(st.chain_acceptance(), 4))})
        logger.info("held-out at step %d: top-1 by position %s, acceptance %.3f",
                    step, held_curve[-1]["top1_by_position"], score[0])
        if bar is not None:
            bar.write(f"held-out step {step}: top-1 {held_curve[-1]['top1_by_position']} "
                      f"acceptance {score[0]:.3f}")
        if best is None or score > best[0]:
            best = (score, step, {k: v.detach().clone() for k, v in model.state_dict().items()},
                    st)

    def save(finished: bool) -> None:
        if checkpoint_dir is None:
            return
        _save_checkpoint(checkpoint_dir, {
            "identity": identity, "step": step, "total": total, "consumed": consumed,
            "epoch_state": epoch_state, "torch_rng": torch.get_rng_state(),
            "model": model.state_dict(), "opt": opt.state_dict(),
            "window": [w.as_tuple() for w in window],
            "curve": curve, "held_curve": held_curve,
            "best": None if best is None else (*best[:3], best[3].as_tuple()),
            "elapsed": elapsed_before + time.perf_counter() - t0, "finished": finished})

    t0 = time.perf_counter()
    steps_at_start = step
    cut = False
    while step < total:
        if deadline is not None and time.perf_counter() > deadline:
            cut = True
            break
        if not epoch:
            check_heldout()
            epoch_state = rng.getstate()
            epoch = make_batches(train, settings.batch_tokens, S, rng)
            consumed = 0
        batch = epoch.pop()
        consumed += 1
        done_here = step - steps_at_start
        if deadline is not None and checkpoint_dir is None and done_here >= 3:
            # plan the schedule to end by the deadline
            per_step = (time.perf_counter() - t0) / done_here
            fits = step + int((deadline - time.perf_counter()) / per_step)
            if fits < total:
                total = max(step + 1, fits)
                if bar is not None:
                    bar.total = total
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, total, settings)
        loss, stats = ttt_loss(model, batch, vocab, head, S, settings.step_weight,
                               settings.prompt_weight)
        opt.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            opt.step()
        window.append(stats)
        if len(window) > per_epoch:
            window.pop(0)
        curve.append((step, float(loss.detach())))
        step += 1
        if eval_every and step % eval_every == 0 and step < total:
            check_heldout()
        if step < total and step % max(1, checkpoint_every) == 0:
            save(False)
        if bar is not None:
            acc = stats.top1()[0]
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}",
                            top1=f"{acc:.2f}" if acc is not None else "-")
    if bar is not None:
        bar.close()
    finished = step >= total
    if checkpoint_dir is not None and not finished:
        save(False)
        logger.info("stopped at step %d of %d; checkpoint in %s", step, total, checkpoint_dir)
    if finished and (not held_curve or held_curve[-1]["step"] != step):
        check_heldout()
    if finished:
        save(True)
    held, best_step = None, None
    if best is not None:
        _, best_step, state, held = best
        if finished:
            model.load_state_dict(state)
    seconds = elapsed_before + time.perf_counter() - t0
    recent = StepStats.zeros(S)
    for st in window:
        recent.add(st)
    model.eval()
    return TrainResult(
        model=model, steps_done=step, steps_planned=planned,
        stopped_by_deadline=cut or step < planned,
        seconds=seconds, train_rows=sum(s.answer_len for s in train),
        heldout_rows=sum(s.answer_len for s in heldout), train_stats=recent,
        heldout_stats=held, loss_curve=curve, heldout_curve=held_curve, best_step=best_step,
        finished=finished, resumed_from=resumed_from,
    )


def iter_state(model: Eagle3DraftModel, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors of a trained draft in ``dtype`` (maps stay integer / bool)."""
    for name, t in model.state_dict().items():
        yield name, (t.detach().to(dtype) if t.is_floating_point() else t.detach().clone())


def summarize(result: TrainResult) -> dict[str, Any]:
    held = result.heldout_stats
    train_top1 = result.train_stats.top1()
    held_top1 = held.top1() if held else None
    return {
        "steps": result.steps_done,
        "steps_planned": result.steps_planned,
        "stopped_by_time_budget": result.stopped_by_deadline,
        "train_seconds": round(result.seconds, 2),
        "train_answer_tokens": result.train_rows,
        "heldout_answer_tokens": result.heldout_rows,
        "train_top1_by_position": train_top1,
        "heldout_top1_by_position": held_top1,
        "heldout_loss_by_position": held.mean_loss() if held else None,
        "heldout_scored_rows_by_position": held.rows if held else None,
        "heldout_expected_acceptance_length": (expected_acceptance_length(held_top1)
                                               if held_top1 else None),
        "heldout_chain_acceptance_length": held.chain_acceptance() if held else None,
        "best_step": result.best_step,
        "resumed_from_step": result.resumed_from,
        "heldout_curve": result.heldout_curve,
        "loss_first": result.loss_curve[0][1] if result.loss_curve else None,
        "loss_last": result.loss_curve[-1][1] if result.loss_curve else None,
    }
