"""Training data for an EAGLE-3 draft: the target's own greedy answers, with its hidden states.

For each prompt (rendered with the target's chat template, as ``eagle3 eval``
and the server render it) the target generates a greedy answer in batches
(left-padded, one KV cache per batch). Every forward is observed by
:class:`~eagle3_backend.verify.targets.HiddenCapture`, so each fed position
``p`` of a sequence ``x_0 .. x_{L-1}`` keeps:

* ``aux[p]``   the layout's states, layout order         [L-1, K*H]
* ``final[p]`` the target's final-normed hidden state    [L-1, H]

(the last token is generated but never fed, hence L-1). ``final`` is what the
target's lm_head reads: ``final[p] @ lm_head.T`` is the target's next-token
logits at ``p``, so the trainer recomputes the teacher distribution over any
draft vocabulary from 576 numbers a token instead of storing 49,152 logits.
Greedy generation means the target's argmax at ``p`` is ``x_{p+1}``.

The target's input embedding, lm_head and final-norm weights travel with the
data, so a cached data set trains without loading the target again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from eagle3_backend.config import DTYPES
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout
from eagle3_backend.verify.report import write_text_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "DATA_FORMAT_VERSION",
    "DataSequence",
    "TrainingData",
    "data_key",
    "generate_data",
    "generate_sequences",
    "load_data",
    "prompt_token_counts",
    "save_data",
]

DATA_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class DataSequence:
    """One prompt + the target's greedy answer, or one teacher-forced conversation.

    ``tokens`` [L] int64 (prompt then answer); ``prompt_len`` n >= 1;
    ``aux`` [L-1, K*H] and ``final`` [L-1, H]: states of positions 0..L-2.

    Teacher-forced conversations (:mod:`eagle3_backend.train.teacher`) carry instead of
    ``final``: ``labels`` [L-1] (the target's argmax at each position, which need not be
    the next token), ``topk_idx`` / ``topk_p`` [L-1, k] (the target's distribution over
    the draft vocabulary, top k: draft ids and probabilities) and ``assistant`` [L] bool
    (which tokens are assistant text; ``prompt_len`` is then the first of them).
    Without ``labels`` the labels are ``tokens[1:]``; without ``assistant`` the
    assistant tokens are those from ``prompt_len`` on.
    """

    id: str
    tokens: torch.Tensor
    prompt_len: int
    aux: torch.Tensor
    final: torch.Tensor | None
    labels: torch.Tensor | None = None
    assistant: torch.Tensor | None = None
    topk_idx: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None

    def __post_init__(self) -> None:
        L = self.tokens.shape[0]
        if not 1 <= self.prompt_len < L:
            raise Eagle3Error(f"sequence {self.id}: prompt_len {self.prompt_len} must be in "
                              f"[1, {L - 1}] for {L} tokens (at least one answer token).")
        if self.final is None and self.topk_idx is None:
            raise Eagle3Error(f"sequence {self.id}: neither final states nor top-k teacher "
                              "probabilities; one of them is the teacher.")
        rows = [t for t in (self.aux, self.final, self.labels, self.topk_idx, self.topk_p)
                if t is not None]
        if any(t.shape[0] != L - 1 for t in rows):
            raise Eagle3Error(
                f"sequence {self.id}: {L} tokens need states for {L - 1} positions, got "
                f"{[list(t.shape) for t in rows]}."
            )

    @property
    def answer_len(self) -> int:
        if self.assistant is not None:
            return int(self.assistant.sum())
        return self.tokens.shape[0] - self.prompt_len

    def label_ids(self) -> torch.Tensor:
        """[L-1] the target's choice after each position."""
        return self.labels if self.labels is not None else self.tokens[1:]

    def assistant_mask(self) -> torch.Tensor:
        """[L] bool: assistant tokens."""
        if self.assistant is not None:
            return self.assistant.bool()
        m = torch.zeros(self.tokens.shape[0], dtype=torch.bool)
        m[self.prompt_len:] = True
        return m


@dataclass(slots=True)
class TrainingData:
    """Sequences plus the target weights the trainer needs (fp32).

    ``embed`` [V, H] input embedding; ``lm_head`` [V, H] output projection (the same
    tensor when tied); ``final_norm`` [H] final RMSNorm weight; ``prior_counts``
    (optional) how often each token occurs in a larger prompt sample, the tie-breaker
    of the draft vocabulary (:func:`eagle3_backend.train.vocab.build_vocab_map`).
    """

    layout: Layout
    sequences: list[DataSequence]
    embed: torch.Tensor
    lm_head: torch.Tensor
    final_norm: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    prior_counts: torch.Tensor | None = None  # [V] token counts of a larger prompt sample

    @property
    def hidden_size(self) -> int:
        return int(self.embed.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.embed.shape[0])

    @property
    def num_answer_tokens(self) -> int:
        return sum(s.answer_len for s in self.sequences)

    @property
    def num_tokens(self) -> int:
        return sum(int(s.tokens.shape[0]) for s in self.sequences)


def data_key(settings: dict[str, Any]) -> str:
    """A short stable hash of the settings that define a data set (cache folder name)."""
    blob = json.dumps({"version": DATA_FORMAT_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- generation
def _pad_left(rows: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, P] left-padded and attention mask [B, P] (1 = real)."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, P - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[b, P - len(r):] = 1
    return ids, mask


@torch.inference_mode()
def generate_batch(target: Any, prompts: Sequence[list[int]], ids: Sequence[str],
                   layout: Layout, max_new_tokens: int, store_dtype: torch.dtype = torch.bfloat16,
                   deadline: float | None = None,
                   final_dtype: torch.dtype | None = None) -> tuple[list[DataSequence], bool]:
    """Greedy answers for a batch of prompts with the layout's states captured.

    Returns the sequences and whether the deadline (``time.perf_counter()`` value) cut
    the answers short. Finished rows (eos or ``max_new_tokens``) leave the batch. The
    final states are kept in ``final_dtype`` (``store_dtype`` unless given).
    """
    from transformers import DynamicCache

    from eagle3_backend.verify.targets import HiddenCapture

    model, device = target.model, target.device
    eos = target.eos_token_ids
    pad_id = min(eos) if eos else 0
    B = len(prompts)
    toks = [list(p) for p in prompts]
    aux_parts: list[list[torch.Tensor]] = [[] for _ in range(B)]
    fin_parts: list[list[torch.Tensor]] = [[] for _ in range(B)]
    x, mask = _pad_left(prompts, pad_id)
    x, mask = x.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)                       # [B, P]
    lm_head = model.get_output_embeddings()
    cache = DynamicCache(config=model.config)
    active = list(range(B))                                        # row of each batch slot
    cut = False
    final_dtype = final_dtype or store_dtype
    with HiddenCapture(model, layout) as cap:
        while True:
            out = model.model(input_ids=x, attention_mask=mask, position_ids=pos,
                              past_key_values=cache, use_cache=True)
            aux = cap.take()                                       # [b, t, K*H]
            final = out.last_hidden_state                          # [b, t, H] final-normed
            nxt = lm_head(final[:, -1]).argmax(dim=-1).tolist()    # [b]
            keep = []
            for slot, row in enumerate(active):
                real = int(mask[slot, -x.shape[1]:].sum()) if x.shape[1] > 1 else 1
                aux_parts[row].append(aux[slot, x.shape[1] - real:].to(store_dtype))
                fin_parts[row].append(final[slot, x.shape[1] - real:].to(final_dtype))
                toks[row].append(nxt[slot])
                if nxt[slot] not in eos and len(toks[row]) - len(prompts[row]) < max_new_tokens:
                    keep.append(slot)
            if not keep:
                break
            if deadline is not None and time.perf_counter() > deadline:
                cut = True
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, pos = mask[index], pos[index]
                nxt = [nxt[s] for s in keep]
                active = [active[s] for s in keep]
            x = torch.tensor(nxt, dtype=torch.long, device=device)[:, None]      # [b, 1]
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
            pos = pos[:, -1:] + 1
    seqs = [
        DataSequence(id=ids[r], tokens=torch.tensor(toks[r], dtype=torch.long),
                     prompt_len=len(prompts[r]), aux=torch.cat(aux_parts[r]).cpu(),
                     final=torch.cat(fin_parts[r]).cpu())
        for r in range(B)
    ]
    return seqs, cut


def _target_weights(target: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    model = target.model
    embed = model.get_input_embeddings().weight.detach().float().cpu()
    head = model.get_output_embeddings().weight.detach()
    head = embed if head.data_ptr() == model.get_input_embeddings().weight.data_ptr() \
        else head.float().cpu()
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise Eagle3Error(
            f"target {target.path}: no final norm weight at model.model.norm; expected a "
            "Llama-style causal LM. This target is not supported by `eagle3 train`."
        )
    return embed, head, norm.weight.detach().float().cpu()


@dataclass(slots=True)
class GenerationStats:
    """What :func:`generate_sequences` did besides producing sequences."""

    skipped_too_long: int
    truncated_by_deadline: bool
    seconds: float


def generate_sequences(target: Any, prompts: Sequence[Any], layout: Layout | str, *,
                       max_new_tokens: int, num_prompts: int | None = None,
                       max_prompt_tokens: int = 256, batch_size: int = 32,
                       store_dtype: str = "bfloat16", seed: int = 0,
                       deadline: float | None = None, chat_template: bool = True,
                       progress: bool = False, desc: str = "data: target answers",
                       ) -> tuple[list[DataSequence], GenerationStats]:
    """The target's greedy answers to ``prompts`` (verify ``Prompt``s) with ``layout``'s
    hidden states captured, one :class:`DataSequence` per prompt.

    The first ``num_prompts`` prompts (all when None) whose rendering (through the chat
    template unless ``chat_template`` is False) is non-empty and fits ``max_prompt_tokens``
    are used; longer ones are skipped and counted. Batches hold prompts of similar length
    and run in a seeded random order, so a ``deadline`` that stops generation early keeps
    a fair sample.
    """
    from eagle3_backend.verify.datasets import encode_prompts

    layout = Layout.parse(layout)
    layout.check_range(target.num_layers)
    if max_new_tokens < 1 or batch_size < 1 or max_prompt_tokens < 1:
        raise Eagle3Error(f"max_new_tokens ({max_new_tokens}), batch_size ({batch_size}) and "
                          f"max_prompt_tokens ({max_prompt_tokens}) must all be >= 1.")
    if store_dtype not in DTYPES:
        raise Eagle3Error(f"store_dtype {store_dtype!r} not in {sorted(DTYPES)}.")
    encoded, skipped = encode_prompts(target.tokenizer, prompts, max_prompt_tokens=max_prompt_tokens,
                                      chat_template=chat_template, limit=num_prompts)
    if not encoded:
        raise Eagle3Error(
            f"all {len(prompts)} prompts are empty or longer than max_prompt_tokens="
            f"{max_prompt_tokens} tokens after the chat template. Raise --max-prompt-tokens or "
            "use shorter prompts."
        )
    encoded.sort(key=lambda e: len(e[1]))
    batches = [encoded[i:i + batch_size] for i in range(0, len(encoded), batch_size)]
    random.Random(seed).shuffle(batches)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(encoded), desc=desc, unit="prompt")
    sequences: list[DataSequence] = []
    truncated = False
    t0 = time.perf_counter()
    for batch in batches:
        if deadline is not None and time.perf_counter() > deadline:
            truncated = True
            break
        seqs, cut = generate_batch(target, [e[1] for e in batch], [e[0] for e in batch],
                                   layout, max_new_tokens, DTYPES[store_dtype], deadline)
        sequences.extend(seqs)
        truncated |= cut
        if bar is not None:
            bar.update(len(batch))
            bar.set_postfix(answer_tokens=sum(s.answer_len for s in sequences))
    if bar is not None:
        bar.close()
    return sequences, GenerationStats(skipped, truncated, time.perf_counter() - t0)


def generate_data(target: Any, prompts: Sequence[Any], layout: Layout | str, *,
                  max_new_tokens: int, num_prompts: int | None = None,
                  max_prompt_tokens: int = 256, batch_size: int = 32,
                  store_dtype: str = "bfloat16", seed: int = 0, deadline: float | None = None,
                  chat_template: bool = True, progress: bool = False) -> TrainingData:
    """Self-distilled training data: :func:`generate_sequences` (same arguments) plus the
    target's embedding, lm_head and final norm the trainer needs."""
    layout = Layout.parse(layout)
    sequences, stats = generate_sequences(
        target, prompts, layout, max_new_tokens=max_new_tokens, num_prompts=num_prompts,
        max_prompt_tokens=max_prompt_tokens, batch_size=batch_size, store_dtype=store_dtype,
        seed=seed, deadline=deadline, chat_template=chat_template, progress=progress)
    embed, head, norm = _target_weights(target)
    n_answer = sum(s.answer_len for s in sequences)
    logger.info("generated %d answers (%d answer tokens) in %.1f s; %d prompts skipped as too long",
                len(sequences), n_answer, stats.seconds, stats.skipped_too_long)
    return TrainingData(
        layout=layout, sequences=sequences, embed=embed, lm_head=head, final_norm=norm,
        meta={"prompts_skipped_too_long": stats.skipped_too_long,
              "prompts_used": len(sequences), "answer_tokens": n_answer,
              "generation_seconds": round(stats.seconds, 2),
              "truncated_by_deadline": stats.truncated_by_deadline,
              "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
              "store_dtype": store_dtype, "target": str(target.path)},
    )


def prompt_token_counts(tokenizer: Any, prompts: Sequence[Any], vocab_size: int) -> torch.Tensor:
    """Token counts [vocab_size] of the prompts' message texts (no chat template): a
    cheap, larger sample of the language the draft vocabulary must cover."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    texts = [content for p in prompts for _, content in p.messages]
    for i in range(0, len(texts), 256):
        for ids in tokenizer(texts[i:i + 256], add_special_tokens=False).input_ids:
            if ids:
                counts += torch.bincount(torch.tensor(ids), minlength=vocab_size)[:vocab_size]
    return counts


# --------------------------------------------------------------------------- cache files
def save_data(data: TrainingData, directory: str | Path) -> Path:
    """Write ``data.safetensors`` + ``meta.json`` into ``directory`` (created)."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    seqs = data.sequences
    tensors = {
        "tokens": torch.cat([s.tokens for s in seqs]),
        "lengths": torch.tensor([s.tokens.shape[0] for s in seqs], dtype=torch.long),
        "prompt_lens": torch.tensor([s.prompt_len for s in seqs], dtype=torch.long),
        "aux": torch.cat([s.aux for s in seqs]),
        "final": torch.cat([s.final for s in seqs]),
        "embed": data.embed.contiguous(),
        "final_norm": data.final_norm.contiguous(),
    }
    tied = data.lm_head is data.embed
    if not tied:
        tensors["lm_head"] = data.lm_head.contiguous()
    if data.prior_counts is not None:
        tensors["prior_counts"] = data.prior_counts.contiguous()
    meta = dict(data.meta)
    meta.update({"format_version": DATA_FORMAT_VERSION, "layout": data.layout.to_strings(),
                 "ids": [s.id for s in seqs], "tied_lm_head": tied})
    tmp = d / "data.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(d / "data.safetensors")
    # meta.json marks the folder complete (see _get_data): written last, and atomically
    write_text_atomic(d / "meta.json", json.dumps(meta, indent=1))
    return d


def read_meta(path: Path, version: int, what: str, fix: str) -> dict[str, Any]:
    """A meta.json this package wrote (``format_version`` == ``version``), as a dict; else an
    Eagle3Error naming the file, ``what`` it describes and the ``fix``."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Eagle3Error(f"{path}: cannot be read as JSON ({exc}); {what} is damaged. {fix}") from None
    found = meta.get("format_version") if isinstance(meta, dict) else None
    if found != version:
        raise Eagle3Error(f"{path}: {what} has format version {found!r}, expected {version}. {fix}")
    return meta


def load_data(directory: str | Path) -> TrainingData:
    """Read a data set written by :func:`save_data`."""
    from safetensors.torch import load_file

    d = Path(directory)
    meta_path, tensor_path = d / "meta.json", d / "data.safetensors"
    if not meta_path.is_file() or not tensor_path.is_file():
        raise Eagle3Error(f"{d} holds no training data (meta.json + data.safetensors); "
                          "expected a folder written by `eagle3 train --cache-data`.")
    meta = read_meta(meta_path, DATA_FORMAT_VERSION, "the cached training data", f"Delete {d} to regenerate it.")
    from safetensors import SafetensorError

    try:
        t = load_file(str(tensor_path))
    except (OSError, SafetensorError) as exc:
        raise Eagle3Error(f"{tensor_path}: not a readable safetensors file ({exc}); the cached "
                          f"training data is damaged. Delete {d} to regenerate it.") from None
    seqs, tok_at, pos_at = [], 0, 0
    for i, (L, n) in enumerate(zip(t["lengths"].tolist(), t["prompt_lens"].tolist())):
        seqs.append(DataSequence(id=meta["ids"][i], tokens=t["tokens"][tok_at:tok_at + L],
                                 prompt_len=n, aux=t["aux"][pos_at:pos_at + L - 1],
                                 final=t["final"][pos_at:pos_at + L - 1]))
        tok_at += L
        pos_at += L - 1
    embed = t["embed"]
    head = embed if meta["tied_lm_head"] else t["lm_head"]
    return TrainingData(layout=Layout.parse(meta["layout"]), sequences=seqs, embed=embed,
                        lm_head=head, final_norm=t["final_norm"], meta=meta,
                        prior_counts=t.get("prior_counts"))
