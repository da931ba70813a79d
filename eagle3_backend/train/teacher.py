"""Teacher-forced training data: the target reads real conversations once (prefill only).

Each conversation (ShareGPT from the bundled package, or a file of recorded chats;
MT-Bench questions always excluded) is rendered whole with the target's chat template,
assistant turns included, and fed to the target in length-bucketed, right-padded
batches. Nothing is generated. Per position ``p`` of ``x_0 .. x_{L-1}`` (positions
0..L-2 kept) the cache stores:

* ``aux[p]``      the layout's states, layout order, fp16/bf16           [L-1, K*H]
* ``labels[p]``   the target's argmax over its whole vocabulary            [L-1]
* ``topk_idx[p]`` / ``topk_p[p]`` its top-k over the draft vocabulary       [L-1, k]
  (draft ids; probabilities of the softmax over the draft vocabulary)
* ``assistant``   which tokens are assistant text (the rows that carry loss) [L]

The draft vocabulary is fixed when the cache is created (the most frequent assistant
tokens of the training conversations, ties by all their tokens), since the top-k
teachers are over it.

The cache is a folder of safetensors shards plus ``meta.json``: the identity (target
file hash, tokenizer and chat-template hash, layout, draft vocabulary hash, k, dtypes,
sequence cap, dataset, order seed) and the list of complete shards. Each shard is
written to a temporary name and renamed, then ``meta.json`` is replaced atomically, so
a killed data pass loses at most the shard in progress and the next run continues
after the last conversation of the last complete shard. A run that needs more tokens
extends the cache; one that needs fewer reads a prefix of it; one whose identity
differs is refused, naming what differs. Shards are memory-mapped when read, so
training holds only the batch in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from eagle3_backend.config import DTYPES
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout
from eagle3_backend.train.data import DataSequence, read_meta
from eagle3_backend.verify.report import write_text_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "TEACHER_FORMAT_VERSION",
    "Conversation",
    "TeacherCache",
    "encode_conversation",
    "heldout_conversation",
    "load_conversations",
    "teacher_batch",
]

TEACHER_FORMAT_VERSION = 1
_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
         "assistant": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
         "bot": "assistant", "system": "system"}


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    messages: tuple[tuple[str, str], ...]      # (role, content), at least one assistant turn


# --------------------------------------------------------------------------- reading
def _turns(raw: Any) -> list[tuple[str, str]] | None:
    """(role, content) turns of a ShareGPT / OpenAI-style list; None when unusable."""
    if not isinstance(raw, list):
        return None
    out: list[tuple[str, str]] = []
    for t in raw:
        if not isinstance(t, dict):
            return None
        role = _ROLE.get(str(t.get("from", t.get("role", ""))).lower())
        content = t.get("value", t.get("content"))
        if role is None or not isinstance(content, str):
            return None
        if content.strip():
            out.append((role, content))
    while out and out[0][0] == "assistant":     # a chat that opens with the assistant
        out.pop(0)
    return out if any(r == "assistant" for r, _ in out) else None


def load_conversations(dataset: str, seed: int) -> tuple[list[Conversation], dict[str, int]]:
    """Recorded chats of ``dataset`` (``sharegpt`` or a JSON/JSONL file of records with a
    ``conversations`` / ``messages`` list), MT-Bench questions excluded, in a seeded order.

    Returns the conversations and counts (records read, skipped, MT-Bench excluded)."""
    from eagle3_backend.verify.datasets import _iter_json_array, sharegpt_path

    key = dataset.strip().lower()
    if key in ("mt-bench", "mtbench", "mt_bench"):
        raise Eagle3Error("--dataset mt-bench is the evaluation set; training on it would "
                          "inflate `eagle3 eval`. Use sharegpt or a conversation file.")
    if key == "sharegpt":
        records = _iter_json_array(sharegpt_path(), allow_truncated=True)
    else:
        path = Path(dataset)
        if not path.is_file():
            raise Eagle3Error(f"--dataset {dataset}: no such file; expected sharegpt or a "
                              "JSON/JSONL file of recorded chats.")
        text = path.read_text(encoding="utf-8-sig")
        records = (json.loads(text) if text.lstrip().startswith("[") else
                   [json.loads(line) for line in text.splitlines() if line.strip()])
    from eagle3_backend.verify.datasets import mtbench_texts

    banned = mtbench_texts()
    convs, counts = [], {"records": 0, "skipped": 0, "mtbench_excluded": 0}
    for i, rec in enumerate(records):
        counts["records"] += 1
        raw = None
        if isinstance(rec, dict):
            raw = next((rec[k] for k in ("conversations", "messages", "conversation")
                        if k in rec), None)
        turns = _turns(raw)
        if turns is None:
            counts["skipped"] += 1
            continue
        if any(c.strip() in banned for r, c in turns if r == "user"):
            counts["mtbench_excluded"] += 1
            continue
        cid = rec.get("id", i) if isinstance(rec, dict) else i
        convs.append(Conversation(f"{key if key == 'sharegpt' else path.stem}-{cid}-{i}",
                                  tuple(turns)))
    if not convs:
        raise Eagle3Error(f"{dataset}: no usable recorded chats ({counts['records']} records, "
                          f"{counts['mtbench_excluded']} MT-Bench); expected records with a "
                          "'conversations' or 'messages' list holding an assistant turn.")
    random.Random(seed).shuffle(convs)
    return convs, counts


def heldout_conversation(cid: str, fraction: float) -> bool:
    """Whether a conversation is held out: by a hash of its id, so the held-out set stays
    the same however far the cache grows."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(cid.encode()).digest()[:8], "big") / 2 ** 64
    return h < fraction


def encode_conversation(tokenizer: Any, conv: Conversation,
                        max_tokens: int) -> tuple[list[int], list[bool]] | None:
    """(token ids, assistant flags) of the conversation through the chat template, cut to
    ``max_tokens``; None when no assistant token survives the cut.

    The assistant spans are the characters each assistant turn adds to the rendering
    after the generation prompt (its text and end-of-turn marker); the whole text is
    tokenized once, as serving tokenizes a prompt, and a token is assistant text when it
    starts inside a span."""
    msgs = [{"role": r, "content": c} for r, c in conv.messages]
    render = lambda m, gen: tokenizer.apply_chat_template(  # noqa: E731
        m, add_generation_prompt=gen, tokenize=False)
    full = render(msgs, False)
    spans = []
    for k, (role, _) in enumerate(conv.messages):
        if role != "assistant":
            continue
        start, end = len(render(msgs[:k], True)), len(render(msgs[:k + 1], False))
        if not full.startswith(render(msgs[:k + 1], False)) or start > end:
            return None                        # a template that rewrites earlier turns
        spans.append((start, end))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"][:max_tokens], enc["offset_mapping"][:max_tokens]
    flags = [any(a <= o[0] < b for a, b in spans) for o in offsets]
    if not any(flags[1:]) or len(ids) < 3:
        return None
    return list(ids), flags


# --------------------------------------------------------------------------- the target pass
@torch.inference_mode()
def teacher_batch(target: Any, rows: Sequence[list[int]], layout: Layout, draft_ids: torch.Tensor,
                  k: int, store_dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    """One right-padded prefill over ``rows``: per row aux, labels, top-k (positions 0..L-2)."""
    from eagle3_backend.verify.targets import HiddenCapture

    model = target.model
    B, T = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.tensor(r)
        mask[b, :len(r)] = 1
    head = model.get_output_embeddings().weight
    draft_head = head[draft_ids]
    with HiddenCapture(model, layout) as cap:
        out = model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device))
        aux = cap.take()
    final = out.last_hidden_state
    res = []
    for b, r in enumerate(rows):
        n = len(r) - 1
        f = final[b, :n]
        labels = (f @ head.T.to(f.dtype)).argmax(-1)
        p = torch.softmax((f @ draft_head.T.to(f.dtype)).float(), dim=-1)
        v, ix = p.topk(k, dim=-1)
        res.append({"aux": aux[b, :n].to(store_dtype).cpu(), "labels": labels.to(torch.int32).cpu(),
                    "topk_idx": ix.to(torch.int32).cpu(), "topk_p": v.to(torch.float16).cpu()})
    return res


# --------------------------------------------------------------------------- the cache
def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def target_identity(path: Path) -> dict[str, Any]:
    """Name, size and a content hash of the target (a file: all of it; a model dir: its
    config.json and the names and sizes of its files)."""
    path = Path(path)
    if path.is_file():
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        return {"name": path.name, "size": path.stat().st_size, "sha256": h.hexdigest()}
    files = sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file())
    cfg = (path / "config.json").read_bytes() if (path / "config.json").is_file() else b""
    return {"name": path.name, "size": sum(s for _, s in files),
            "sha256": _sha(cfg + json.dumps(files).encode())}


def tokenizer_identity(tokenizer: Any) -> str:
    """Hash of the chat template and the vocabulary."""
    vocab = sorted(tokenizer.get_vocab().items())
    return _sha(json.dumps([getattr(tokenizer, "chat_template", None), vocab]))


def _mmap_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a safetensors file as views of a copy-on-write memory map."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {}) or {}
    mm = np.memmap(path, dtype=np.uint8, mode="c")
    base = 8 + n
    dtypes = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
              "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool,
              "I16": torch.int16}
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        raw = torch.from_numpy(mm[base + a: base + b])
        out[name] = raw.view(dtypes[info["dtype"]]).reshape(info["shape"])
    return out, meta


class TeacherCache:
    """A sharded teacher-forced data set on disk (see the module docstring)."""

    META = "meta.json"

    def __init__(self, directory: str | Path, identity: dict[str, Any],
                 fix: str = "Use another --teacher-cache folder, or delete this one to "
                            "rebuild it.", free: tuple[str, ...] = ()):
        """``free``: identity fields an existing cache may hold other values of (kept as
        the cache's)."""
        self.dir = Path(directory)
        self.identity = identity
        self.meta: dict[str, Any] = {"format_version": TEACHER_FORMAT_VERSION,
                                     "identity": identity, "shards": [],
                                     "next_conversation": 0}
        path = self.dir / self.META
        if path.is_file():
            meta = read_meta(path, TEACHER_FORMAT_VERSION, "the teacher cache",
                             f"Delete {self.dir} to rebuild it.")
            theirs = meta.get("identity")
            theirs = theirs if isinstance(theirs, dict) else {}
            diff = [k for k in sorted(set(identity) | set(theirs))
                    if k not in free and identity.get(k) != theirs.get(k)]
            if diff:
                lines = "; ".join(f"{k}: cache has {theirs.get(k)!r}, this run needs "
                                  f"{identity.get(k)!r}" for k in diff)
                raise Eagle3Error(f"teacher cache {self.dir} was written for another setup "
                                  f"({lines}). {fix}")
            self.meta, self.identity = meta, theirs

    @classmethod
    def finished(cls, directory: str | Path, identity: dict[str, Any]) -> "TeacherCache":
        """An existing cache, read as it is (never extended), written for ``identity`` on
        other conversations: every identity field but ``first_conversation`` must match."""
        if not (Path(directory) / cls.META).is_file():
            raise Eagle3Error(f"{directory}: not a teacher cache (no {cls.META}). "
                              "--add-teacher-cache takes a folder that an earlier run's "
                              "--teacher-cache wrote.")
        cache = cls(directory, identity, free=("first_conversation",),
                    fix="Leave it out of --add-teacher-cache, or train with the setup it "
                        "was written for.")
        if not cache.shards:
            raise Eagle3Error(f"teacher cache {cache.dir} holds no conversations; leave it "
                              "out of --add-teacher-cache.")
        return cache

    @property
    def conversations(self) -> tuple[int, int]:
        """[first, next) positions of this cache's chats in the seeded order."""
        return int(self.identity.get("first_conversation") or 0), self.next_conversation

    # -- contents
    @property
    def shards(self) -> list[dict[str, Any]]:
        return self.meta["shards"]

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    @property
    def next_conversation(self) -> int:
        return int(self.meta["next_conversation"])

    def write_vocab(self, target_ids: torch.Tensor, embed: torch.Tensor) -> None:
        from safetensors.torch import save_file

        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / "target.safetensors.tmp"
        save_file({"draft_ids": target_ids.long().contiguous(), "embed": embed.contiguous()},
                  str(tmp))
        tmp.replace(self.dir / "target.safetensors")

    def read_target(self, embed: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(draft vocabulary target ids [Vd], the target's input embedding [V, H], or None
        when ``embed`` is False: only the ids are read then)."""
        from safetensors import safe_open

        with safe_open(str(self.dir / "target.safetensors"), framework="pt") as f:
            return f.get_tensor("draft_ids"), f.get_tensor("embed") if embed else None

    def add_shard(self, seqs: Sequence[tuple[str, list[int], list[bool], dict[str, torch.Tensor]]],
                  next_conversation: int, seconds: float) -> None:
        from safetensors.torch import save_file

        self.dir.mkdir(parents=True, exist_ok=True)
        n = len(self.shards)
        name = f"shard-{n:05d}.safetensors"
        tensors = {
            "tokens": torch.tensor([t for _, ids, _, _ in seqs for t in ids], dtype=torch.int32),
            "lengths": torch.tensor([len(ids) for _, ids, _, _ in seqs], dtype=torch.int32),
            "assistant": torch.tensor([f for _, _, fl, _ in seqs for f in fl], dtype=torch.uint8),
        }
        for key in ("aux", "labels", "topk_idx", "topk_p"):
            tensors[key] = torch.cat([d[key] for *_, d in seqs]).contiguous()
        tmp = self.dir / (name + ".tmp")
        save_file(tensors, str(tmp), metadata={"ids": json.dumps([s[0] for s in seqs])})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        tmp.replace(self.dir / name)
        self.shards.append({"file": name, "sequences": len(seqs),
                            "tokens": int(tensors["tokens"].numel()),
                            "assistant_tokens": int(tensors["assistant"].sum()),
                            "seconds": round(seconds, 2)})
        self.meta["next_conversation"] = next_conversation
        write_text_atomic(self.dir / self.META, json.dumps(self.meta, indent=1))

    def sequences(self, max_tokens: int | None = None) -> list[DataSequence]:
        """The stored conversations (memory-mapped), whole shards until ``max_tokens``."""
        out: list[DataSequence] = []
        total = 0
        for sh in self.shards:
            if max_tokens is not None and total >= max_tokens:
                break
            path = self.dir / sh["file"]
            if not path.is_file():
                raise Eagle3Error(f"{path}: missing; the teacher cache is damaged. Delete "
                                  f"{self.dir} to rebuild it.")
            t, meta = _mmap_safetensors(path)
            ids = json.loads(meta["ids"])
            tok_at = pos_at = 0
            for i, L in enumerate(t["lengths"].tolist()):
                flags = t["assistant"][tok_at:tok_at + L].bool()
                first = int(flags[1:].nonzero()[0]) + 1
                out.append(DataSequence(
                    id=ids[i], tokens=t["tokens"][tok_at:tok_at + L].long(), prompt_len=first,
                    aux=t["aux"][pos_at:pos_at + L - 1], final=None,
                    labels=t["labels"][pos_at:pos_at + L - 1].long(), assistant=flags,
                    topk_idx=t["topk_idx"][pos_at:pos_at + L - 1],
                    topk_p=t["topk_p"][pos_at:pos_at + L - 1]))
                tok_at += L
                pos_at += L - 1
            total += sh["tokens"]
        return out


def draft_vocab_counts(tokenizer: Any, convs: Sequence[Conversation], vocab_size: int,
                       max_tokens: int, heldout_fraction: float,
                       count_tokens: int = 1_500_000) -> tuple[torch.Tensor, torch.Tensor]:
    """(assistant-token counts, all-token counts) over the training (not held-out)
    conversations, in order, until ``count_tokens`` tokens are counted."""
    asst = torch.zeros(vocab_size, dtype=torch.long)
    every = torch.zeros(vocab_size, dtype=torch.long)
    for c in convs:
        if int(every.sum()) >= count_tokens:
            break
        if heldout_conversation(c.id, heldout_fraction):
            continue
        e = encode_conversation(tokenizer, c, max_tokens)
        if e is None:
            continue
        ids, flags = torch.tensor(e[0]), torch.tensor(e[1])
        every += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
        asst += torch.bincount(ids[flags], minlength=vocab_size)[:vocab_size]
    return asst, every


Record = tuple[str, list[int], list[bool], dict[str, torch.Tensor]]   # one conversation of a shard


def _fill(cache: TeacherCache, n_convs: int, want_tokens: int,
          make_shard: Callable[[int, int, Any], tuple[list[Record] | None, int]], *, desc: str,
          deadline: float | None, progress: bool) -> bool:
    """The shard loop both fills share: ``make_shard(pos, tokens still needed, bar)`` gives
    the next shard's records (None: the deadline passed inside it) and the conversation
    after them; each complete shard is written before the next begins."""
    need = want_tokens - cache.tokens
    if need <= 0 or cache.next_conversation >= n_convs:
        return True
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=need, desc=desc, unit="tok", unit_scale=True, smoothing=0.05)
    done, pos = 0, cache.next_conversation
    try:
        while done < need and pos < n_convs:
            if deadline is not None and time.perf_counter() > deadline:
                return False
            t0 = time.perf_counter()
            records, pos = make_shard(pos, need - done, bar)
            if records is None:
                return False
            if not records:
                break
            cache.add_shard(records, next_conversation=pos, seconds=time.perf_counter() - t0)
            done += sum(len(r[1]) for r in records)
            logger.info("teacher cache %s: %d shards, %d tokens", cache.dir, len(cache.shards),
                        cache.tokens)
    finally:
        if bar is not None:
            bar.close()
    return True


def fill_cache(cache: TeacherCache, target: Any, convs: Sequence[Conversation],
               encode: Callable[[Conversation], tuple[list[int], list[bool]] | None],
               layout: Layout, draft_ids: torch.Tensor, *, k: int, store_dtype: str,
               want_tokens: int, batch_tokens: int = 2048, shard_tokens: int = 32768,
               deadline: float | None = None, progress: bool = False) -> bool:
    """Extend the cache, from its next conversation on (``encode`` gives the token ids and
    assistant flags, None to skip one), until it holds ``want_tokens`` tokens or the
    conversations run out. Returns False when the deadline stopped it first."""
    store = DTYPES[store_dtype]

    def shard(pos: int, need: int, bar: Any) -> tuple[list[Record] | None, int]:
        # the next conversations worth shard_tokens (or what is still needed)
        chunk, n = [], 0
        while pos < len(convs) and n < min(shard_tokens, need):
            e = encode(convs[pos])
            if e is not None:
                chunk.append((convs[pos].id, *e))
                n += len(e[0])
            pos += 1
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i][1]))
        results: dict[int, dict[str, torch.Tensor]] = {}
        batch: list[int] = []
        for i in order + [None]:
            if i is not None and (not batch or (len(batch) + 1) * len(chunk[i][1]) <= batch_tokens):
                batch.append(i)
                continue
            for j, r in zip(batch, teacher_batch(target, [chunk[j][1] for j in batch],
                                                 layout, draft_ids, k, store)):
                results[j] = r
                if bar is not None:
                    bar.update(len(chunk[j][1]))
            batch = [i] if i is not None else []
            if deadline is not None and time.perf_counter() > deadline:
                return None, pos
        return [(*c, results[j]) for j, c in enumerate(chunk)], pos

    return _fill(cache, len(convs), want_tokens, shard, desc="data: teacher-forced prefill",
                 deadline=deadline, progress=progress)


def turn_prompt(conv: Conversation, turn: int = 1) -> Any:
    """The conversation up to its ``turn``-th user turn (1: the first; the recorded turns
    before it kept, system turns included), as the verify ``Prompt`` that ``eagle3 eval``
    and the server render; None when anything but system turns precedes its first user
    turn, or it has fewer user turns."""
    from eagle3_backend.verify.datasets import Prompt

    users = [k for k, (role, _) in enumerate(conv.messages) if role == "user"]
    if (turn < 1 or len(users) < turn
            or any(role != "system" for role, _ in conv.messages[:users[0]])):
        return None
    return Prompt(conv.id, conv.messages[:users[turn - 1] + 1])


def fill_cache_answers(cache: TeacherCache, target: Any, convs: Sequence[Conversation],
                       layout: Layout, draft_ids: torch.Tensor, *, k: int, store_dtype: str,
                       want_tokens: int, max_new_tokens: int, max_prompt_tokens: int,
                       turn: int = 1, gen_batch: int = 32, shard_prompts: int = 128,
                       deadline: float | None = None, progress: bool = False) -> bool:
    """:func:`fill_cache` with the target's own greedy answers as the assistant turns.

    Each conversation's ``turn``-th user turn with the recorded turns before it (through
    the chat template, as served; conversations with fewer user turns, or longer than
    ``max_prompt_tokens``, skipped) is answered greedily, ``max_new_tokens`` at most,
    in length-sorted batches of ``gen_batch``, capturing the layout's states as the
    answer is generated, so the stored tokens are the ones the target produced and no
    second pass runs. Labels are the target's argmax (the next answer token); the top-k
    teachers come from its fp32 final states over the draft vocabulary. ``shard_prompts``
    prompts make a shard; the cache resumes after the last complete one."""
    from eagle3_backend.train.data import generate_batch
    from eagle3_backend.train.trainer import to_topk
    from eagle3_backend.verify.datasets import render_prompt

    head = target.model.get_output_embeddings().weight.detach()[draft_ids].float()
    store = DTYPES[store_dtype]

    def shard(pos: int, need: int, bar: Any) -> tuple[list[Record] | None, int]:
        chunk: list[tuple[str, list[int]]] = []
        while pos < len(convs) and len(chunk) < shard_prompts:
            p = turn_prompt(convs[pos], turn)
            ids = render_prompt(target.tokenizer, p) if p is not None else []
            if 0 < len(ids) <= max_prompt_tokens:
                chunk.append((convs[pos].id, ids))
            pos += 1
        chunk.sort(key=lambda c: len(c[1]))
        records: list[Record] = []
        for i in range(0, len(chunk), gen_batch):
            part = chunk[i:i + gen_batch]
            seqs, _ = generate_batch(target, [c[1] for c in part], [c[0] for c in part],
                                     layout, max_new_tokens, store, final_dtype=torch.float32)
            for s in to_topk(seqs, head, k):
                records.append((s.id, s.tokens.tolist(), s.assistant.tolist(), {
                    "aux": s.aux, "labels": s.labels.to(torch.int32),
                    "topk_idx": s.topk_idx, "topk_p": s.topk_p}))
                if bar is not None:
                    bar.update(int(s.tokens.shape[0]))
            if deadline is not None and time.perf_counter() > deadline:
                return None, pos
        return records, pos

    return _fill(cache, len(convs), want_tokens, shard, desc="data: target answers",
                 deadline=deadline, progress=progress)
