"""``eagle3 train``: self-distilled data from a target, EAGLE-3 TTT training, an SGLang checkpoint.

Wired into :mod:`eagle3_backend.cli` with ``add_train_parser(sub)`` in
``build_parser()``; the subparser's ``func`` is :func:`run_train` (exit 0).

    eagle3 train --out artifacts/smollm2-draft            # bundled SmolLM2 target, ShareGPT
    eagle3 train --target T --dataset FILE.jsonl --out DIR --layout "[embed, layer_input:15]"

Writes DIR/config.json + DIR/model.safetensors (SGLang format, the embedding
taken from the target) and DIR/train_report.json.

With ``--minutes`` the run fills a wall-clock budget: answers are generated until
40% of it, then training runs as many epochs as fit (the cosine schedule shrinks
to end in time) and the best held-out weights are kept. At this scale the draft
is under-trained rather than short of data: on SmolLM2-135M, 11k answer tokens
trained 4.5 epochs reached the held-out top-1 that 22k tokens reached only after
4 epochs, so the budget favours training over generation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from eagle3_backend.checkpoint.files import TRAIN_REPORT as REPORT_NAME
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.verify.datasets import FILE_HELP

logger = logging.getLogger(__name__)

__all__ = ["add_train_parser", "run_train"]

DATA_SHARE = 0.40      # of --minutes: generation stops here at the latest (see run_train)
RESERVE_SHARE = 0.04   # of --minutes kept for the held-out pass and writing


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    from eagle3_backend.checkpoint.files import force_help
    from eagle3_backend.verify.targets import allow_pickle_help

    p = subparsers.add_parser(
        "train", help="train an EAGLE-3 draft on the target's own answers (SGLang checkpoint)",
        description="Generate the target's greedy answers to chat prompts while capturing the "
                    "layout's hidden states, train a draft with training-time test, and write an "
                    "SGLang-format checkpoint (embedding taken from the target) plus "
                    "train_report.json.")
    p.add_argument("--target", default="bundled",
                   help="HF model dir or .gguf file (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dataset", default="sharegpt",
                   help=f"sharegpt | {FILE_HELP} (default sharegpt; MT-Bench questions are "
                        "always excluded)")
    p.add_argument("--out", required=True, metavar="DIR", help="new or empty checkpoint directory")
    p.add_argument("--force", action="store_true", help=force_help("DIR"))
    p.add_argument("--layout", default=None,
                   help="hidden-state layout, e.g. \"[embed, layer_input:15]\" (default: SGLang's "
                        "default for the target)")
    g = p.add_argument_group("data")
    g.add_argument("--num-prompts", type=int, default=600, metavar="N",
                   help="prompts to answer (default 600)")
    g.add_argument("--max-new-tokens", type=int, default=96, metavar="M",
                   help="answer tokens per prompt at most (default 96)")
    g.add_argument("--max-prompt-tokens", type=int, default=256, metavar="P",
                   help="skip prompts longer than this after the chat template (default 256)")
    g.add_argument("--no-chat-template", action="store_true",
                   help="answer the raw prompt text (a base model without a chat template; "
                        "--source generated only); evaluate the draft with eval "
                        "--no-chat-template too")
    g.add_argument("--gen-batch", type=int, default=32, metavar="B",
                   help="prompts generated together (default 32)")
    g.add_argument("--vocab-prompts", type=int, default=4000, metavar="N",
                   help="prompts whose text (tokenized only) ranks the draft vocabulary after "
                        "the answer tokens (default 4000)")
    g.add_argument("--cache-data", default=None, metavar="DIR",
                   help="reuse / store the generated data under DIR/data-<settings hash> (and "
                        "the teacher-forced data under DIR/teacher unless --teacher-cache)")
    g.add_argument("--source", default="generated", choices=("generated", "teacher", "mix"),
                   help="generated: the target's own greedy answers to --num-prompts prompts; "
                        "teacher: one teacher-forced pass of the target over whole recorded "
                        "chats (--teacher-tokens); mix: both (default generated)")
    g.add_argument("--answers", default="recorded", choices=("recorded", "target"),
                   help="the teacher-forced chats' assistant turns: recorded (their own) or "
                        "target (the target's greedy answer to each chat's first user turn, "
                        "--max-new-tokens at most, generated once into the sharded cache; "
                        "the data the draft meets when served; default recorded)")
    g.add_argument("--answer-turn", type=int, default=1, metavar="N",
                   help="with --answers target: answer each chat's Nth user turn, its recorded "
                        "turns before it as context (chats with fewer user turns skipped): "
                        "other data from the same chats once their first turns are used "
                        "(default 1)")
    g.add_argument("--teacher-tokens", type=int, default=200_000, metavar="N",
                   help="tokens of teacher-forced conversations to train on, held-out ones "
                        "included (whole cache shards; the cache grows to this; default 200000)")
    g.add_argument("--first-conversation", type=int, default=0, metavar="N",
                   help="a new teacher cache starts at the Nth conversation of the seeded order "
                        "(0-based): other chats than a cache that stopped before N, for a "
                        "later training stage on new data (default 0)")
    g.add_argument("--teacher-cache", default=None, metavar="DIR",
                   help="sharded teacher-forced data set, created, extended and reused; "
                        "refused when written for another target, layout or vocabulary")
    g.add_argument("--add-teacher-cache", action="append", default=None, metavar="DIR",
                   help="train also on this finished teacher cache (repeatable): every shard, "
                        "read as it is; written for the same target, layout, vocabulary and "
                        "answers as --teacher-cache, on other conversations (an earlier "
                        "stage's --first-conversation cache)")
    g.add_argument("--max-seq-tokens", type=int, default=512, metavar="L",
                   help="teacher-forced conversations are cut to L tokens (default 512)")
    g.add_argument("--topk", type=int, default=8, metavar="K",
                   help="teacher probabilities kept per position over the draft vocabulary "
                        "(default 8)")
    g.add_argument("--teacher-batch-tokens", type=int, default=2048, metavar="N",
                   help="padded tokens per teacher-forced prefill (default 2048)")
    g.add_argument("--teacher-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the target's dtype in the teacher-forced pass (default float32)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=None, metavar="S",
                   help="optimizer steps (default: --epochs passes over the data)")
    g.add_argument("--epochs", type=float, default=None,
                   help="passes over the data when --steps is not given (default 3; with "
                        "--minutes: as many as fit, at most 20)")
    g.add_argument("--ttt-steps", type=int, default=3, metavar="K",
                   help="draft steps unrolled in training (training-time test; default 3)")
    g.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                   help="the draft layer's MLP width (default: the target's intermediate_size)")
    g.add_argument("--init-from", default=None, metavar="DRAFT",
                   help="start from this draft's weights (same layout, draft vocabulary and "
                        "shapes; e.g. a finished run, to train it further on a new schedule)")
    g.add_argument("--draft-layers", type=int, default=1, metavar="N",
                   help="decoder layers in the draft (default 1; SGLang's llama_eagle3 serves more)")
    g.add_argument("--draft-vocab", type=int, default=8192, metavar="V",
                   help="draft vocabulary: the V most frequent answer tokens (default 8192)")
    g.add_argument("--batch-tokens", type=int, default=512, metavar="N",
                   help="padded positions per optimizer step (default 512)")
    g.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (default 2e-3)")
    g.add_argument("--heldout-fraction", type=float, default=0.05,
                   help="share of answers held out for the top-1 report (default 0.05)")
    g.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="resumable training: the whole training state is saved here every "
                        "--checkpoint-every steps and when --minutes runs out; the same "
                        "command run again continues from it (exit 3 while unfinished)")
    g.add_argument("--checkpoint-every", type=int, default=100, metavar="N",
                   help="steps between checkpoints (default 100)")
    g.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="held-out top-1 every N steps as well as after every epoch")
    p.add_argument("--minutes", type=float, default=None, metavar="M",
                   help=f"wall-clock budget for the whole run: generation stops at "
                        f"{round(DATA_SHARE * 100)}%% of it, training before its end "
                        "(default: none); with --checkpoint-dir the schedule stays fixed and the "
                        "run stops, resumable, when the budget is spent")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"),
                   help="dtype of the written weights (training runs in float32; default bfloat16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: safest on a shared machine)")
    p.add_argument("--allow-pickle", action="store_true", help=allow_pickle_help(False))
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_train)
    return p


# --------------------------------------------------------------------------- pieces
def _prompts(dataset: str, seed: int) -> tuple[list[Any], int]:
    """All prompts of the dataset minus MT-Bench questions, in a seeded random order."""
    from eagle3_backend.verify.datasets import load_prompts

    key = dataset.strip().lower()
    if key in ("mt-bench", "mtbench", "mt_bench"):
        raise Eagle3Error("--dataset mt-bench is the evaluation set; training on it would "
                          "inflate `eagle3 eval`. Use sharegpt or a prompt file.")
    prompts = load_prompts(dataset)
    from eagle3_backend.verify.datasets import mtbench_texts

    banned = mtbench_texts()
    kept = [p for p in prompts if p.text.strip() not in banned]
    if not kept:
        raise Eagle3Error(f"all {len(prompts)} prompts of {dataset} are MT-Bench questions, the "
                          "evaluation set, which training always excludes. Train on other "
                          "prompts (sharegpt or your own file).")
    random.Random(seed).shuffle(kept)
    return kept, len(prompts) - len(kept)


def _data_settings(args: argparse.Namespace, target_path: Path, layout: Any) -> dict[str, Any]:
    st = target_path.stat()
    return {"target": str(target_path.resolve()), "target_size": st.st_size,
            "dataset": args.dataset, "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens,
            "layout": layout.to_strings(), "seed": args.seed, "store_dtype": "bfloat16",
            "vocab_prompts": args.vocab_prompts,
            # only when set: the caches of chat-template runs keep their keys
            **({"chat_template": False} if args.no_chat_template else {})}


def _get_data(args: argparse.Namespace, target_path: Path, layout: Any,
              deadline: float | None, progress: bool) -> tuple[Any, dict[str, Any]]:
    from eagle3_backend.train.data import data_key, generate_data, load_data, save_data

    settings = _data_settings(args, target_path, layout)
    cache_dir = None
    if args.cache_data:
        cache_dir = Path(args.cache_data) / f"data-{data_key(settings)}"
        if (cache_dir / "meta.json").is_file():
            logger.info("reusing training data from %s", cache_dir)
            data = load_data(cache_dir)
            return data, {"source": "cache", "cache_dir": str(cache_dir)}
    from eagle3_backend.verify.targets import load_target

    prompts, excluded = _prompts(args.dataset, args.seed)  # a wrong --dataset before the target
    t0 = time.perf_counter()
    target = load_target(target_path, "float32", "cpu", allow_pickle=args.allow_pickle,
                         progress=not args.no_progress)
    load_s = time.perf_counter() - t0
    data = generate_data(target, prompts, layout, max_new_tokens=args.max_new_tokens,
                         num_prompts=args.num_prompts, max_prompt_tokens=args.max_prompt_tokens,
                         batch_size=args.gen_batch, seed=args.seed, deadline=deadline,
                         chat_template=not args.no_chat_template, progress=progress)
    from eagle3_backend.train.data import prompt_token_counts

    sample = prompts[:args.vocab_prompts]
    data.prior_counts = prompt_token_counts(target.tokenizer, sample, target.vocab_size)
    data.meta["vocab_prior_prompts"] = len(sample)
    data.meta["mtbench_prompts_excluded"] = excluded
    data.meta["target_load_seconds"] = round(load_s, 2)
    if not data.sequences:
        raise Eagle3Error("no answers were generated before the time budget ran out; "
                          "raise --minutes or lower --num-prompts.")
    info: dict[str, Any] = {"source": "generated"}
    if cache_dir is not None and not data.meta.get("truncated_by_deadline"):
        save_data(data, cache_dir)
        info["cache_dir"] = str(cache_dir)
    return data, info


class Unfinished(Exception):
    """The --minutes budget ran out in a resumable run; the message says where it stopped."""


def _teacher_data(args: argparse.Namespace, target_path: Path, layout: Any,
                  deadline: float | None, progress: bool) -> tuple[list[Any], Any, Any, dict[str, Any]]:
    """(teacher-forced sequences, draft vocab target ids, target embedding, report info)."""
    import torch

    from eagle3_backend.train import teacher as tf
    from eagle3_backend.train.vocab import build_vocab_map
    from eagle3_backend.verify.targets import load_target

    cache_dir = (Path(args.teacher_cache) if args.teacher_cache else
                 Path(args.cache_data) / "teacher" if args.cache_data else None)
    if cache_dir is None:
        raise Eagle3Error("--source teacher/mix writes a sharded data set: pass --teacher-cache "
                          "DIR (or --cache-data DIR, which puts it in DIR/teacher).")
    convs, counts = tf.load_conversations(args.dataset, args.seed)
    if args.first_conversation >= len(convs):
        raise Eagle3Error(f"--first-conversation {args.first_conversation}: {args.dataset} has "
                          f"{len(convs)} usable conversations; start below that.")
    t0 = time.perf_counter()
    target = load_target(target_path, args.teacher_dtype, "cpu", allow_pickle=args.allow_pickle,
                         progress=not args.no_progress)
    load_s = time.perf_counter() - t0
    ds = args.dataset if args.dataset.strip().lower() == "sharegpt" else \
        {"file": str(Path(args.dataset).resolve()), "size": Path(args.dataset).stat().st_size}
    identity = {"target": tf.target_identity(target_path),
                "tokenizer": tf.tokenizer_identity(target.tokenizer),
                "layout": layout.to_strings(), "draft_vocab": args.draft_vocab,
                "topk": args.topk, "max_seq_tokens": args.max_seq_tokens,
                "store_dtype": "bfloat16", "teacher_dtype": args.teacher_dtype, "dataset": ds,
                "order_seed": args.seed, "heldout_fraction": args.heldout_fraction}
    if args.first_conversation:       # caches from conversation 0 keep their identity
        identity["first_conversation"] = args.first_conversation
    if args.answers == "target":      # recorded caches keep the identity they were written with
        identity["answers"] = {"by": "target, greedy", "max_new_tokens": args.max_new_tokens,
                               "max_prompt_tokens": args.max_prompt_tokens}
        if args.answer_turn != 1:     # first-turn caches keep the identity they were written with
            identity["answers"]["turn"] = args.answer_turn
    cache = tf.TeacherCache(cache_dir, identity)
    encode = lambda c: tf.encode_conversation(target.tokenizer, c, args.max_seq_tokens)  # noqa: E731
    if not cache.shards and not (cache.dir / "target.safetensors").is_file():
        # a new cache: the draft vocabulary from the training conversations' assistant tokens
        asst, every = tf.draft_vocab_counts(target.tokenizer, convs, target.vocab_size,
                                            args.max_seq_tokens, args.heldout_fraction)
        vocab = build_vocab_map(asst, min(args.draft_vocab, target.vocab_size), every)
        embed = target.model.get_input_embeddings().weight.detach().float().cpu()
        cache.write_vocab(vocab.target_ids, embed)
    draft_ids, embed = cache.read_target()
    if not cache.shards:
        cache.meta["next_conversation"] = args.first_conversation
    more = [tf.TeacherCache.finished(d, identity) for d in args.add_teacher_cache or []]
    for c in more:                               # refused before the data pass, not after
        if not torch.equal(c.read_target(embed=False)[0], draft_ids):
            raise Eagle3Error(f"--add-teacher-cache {c.dir}: its draft vocabulary is not "
                              f"{cache.dir}'s; the top-k teachers of the two cannot be mixed. "
                              "Leave it out, or build both from the same dataset and seed.")
    _check_disjoint(cache, more)
    t1 = time.perf_counter()
    if args.answers == "target":
        complete = tf.fill_cache_answers(
            cache, target, convs, layout, draft_ids, k=args.topk, store_dtype="bfloat16",
            want_tokens=args.teacher_tokens, max_new_tokens=args.max_new_tokens,
            max_prompt_tokens=args.max_prompt_tokens, turn=args.answer_turn,
            gen_batch=args.gen_batch,
            deadline=deadline, progress=progress)
    else:
        complete = tf.fill_cache(cache, target, convs, encode, layout, draft_ids, k=args.topk,
                                 store_dtype="bfloat16", want_tokens=args.teacher_tokens,
                                 batch_tokens=args.teacher_batch_tokens, deadline=deadline,
                                 progress=progress)
    pass_s = time.perf_counter() - t1
    if not complete and args.checkpoint_dir:
        raise Unfinished(f"the teacher-forced data pass stopped at the --minutes budget with "
                         f"{cache.tokens:,} of {args.teacher_tokens:,} tokens in {cache.dir}")
    seqs = cache.sequences(args.teacher_tokens)
    if not seqs:
        raise Eagle3Error(f"teacher cache {cache.dir} holds no conversations yet; raise "
                          "--minutes so the data pass can write a shard.")
    _check_disjoint(cache, more)                  # the data pass may have grown it
    added = []
    for c in more:
        part = c.sequences()
        seqs += part
        added.append({"cache_dir": str(c.dir), "shards": len(c.shards), "tokens": c.tokens,
                      "conversations": list(c.conversations), "conversations_used": len(part)})
    info = {"cache_dir": str(cache.dir), "answers": args.answers, "shards": len(cache.shards),
            "cache_tokens": cache.tokens, "tokens_used": sum(int(s.tokens.shape[0]) for s in seqs),
            "conversations_used": len(seqs), "conversations_available": len(convs),
            **({"added_caches": added} if added else {}),
            **{f"dataset_{k}": v for k, v in counts.items()},
            "target_load_seconds": round(load_s, 2), "pass_seconds_this_run": round(pass_s, 2),
            "prefill_tokens_per_second": round(
                sum(sh["tokens"] for sh in cache.shards) /
                max(1e-9, sum(sh["seconds"] for sh in cache.shards)), 1)}
    del target
    return seqs, draft_ids, embed, info


def _check_disjoint(cache: Any, more: list[Any]) -> None:
    """Refuse --add-teacher-cache caches whose chats overlap each other's or ``cache``'s
    (which, empty still, will hold at least its first chat)."""
    for i, c in enumerate(more):
        a, b = c.conversations
        for other in [cache, *more[:i]]:
            s, e = other.conversations
            e = max(e, s + 1)
            if c.dir.resolve() == other.dir.resolve() or (a < e and s < b):
                held = f"{s}..{e - 1}" if other.shards else f"from {s}"
                raise Eagle3Error(f"--add-teacher-cache {c.dir}: its conversations {a}..{b - 1} "
                                  f"overlap {other.dir}'s ({held}); each chat would be "
                                  "trained on twice. Add caches of other conversations.")


def _draft_config(t: Any, layout: Any, draft_vocab: int, dtype: str,
                  intermediate_size: int | None = None, layers: int = 1) -> Any:
    """``layers`` Llama decoder layers shaped like the target's (attention, MLP, rotary,
    context); ``intermediate_size`` widens (or narrows) their MLP.

    ``fc_norm``: an RMSNorm per layout slot before fc. Middle and late residual streams
    carry a few massive activations (SmolLM2-135M: |x| up to ~25,000 on the first token,
    typical dims ~1-40); unnormalised, they swamp the fc output and the residual the
    draft layer adds to. SGLang 0.5.23 reads ``fc_norm`` from the draft config.
    """
    from eagle3_backend.config import DraftConfig

    if t.num_attention_heads is None:
        raise Eagle3Error(f"{t.source}: the target does not record num_attention_heads; the "
                          "draft copies the target's attention shape. Use a target config.json "
                          "or GGUF that records it.")
    return DraftConfig(
        hidden_size=t.hidden_size,
        intermediate_size=intermediate_size or t.intermediate_size or 4 * t.hidden_size,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads or t.num_attention_heads,
        head_dim=t.head_dim, vocab_size=t.vocab_size, draft_vocab_size=draft_vocab,
        target_hidden_size=t.hidden_size, layout=layout, rms_norm_eps=t.rms_norm_eps or 1e-6,
        rope_theta=t.rope_theta or 10000.0,
        max_position_embeddings=t.max_position_embeddings or 2048,
        fc_norm=True, has_embed_tokens=False, dtype=dtype, num_hidden_layers=layers,
    )


def _init_from(model: Any, path: Path, target_info: Any, layout: Any, vocab: Any,
               allow_pickle: bool) -> None:
    """Load ``path``'s weights into the freshly built ``model``, or name every difference."""
    import torch

    from eagle3_backend.checkpoint import load_draft, to_layout

    init = load_draft(path, target=target_info, strict=True, allow_pickle=allow_pickle)
    problems = []
    if sorted(init.config.layout.layers) != sorted(layout.layers):
        problems.append(f"its layout is {init.config.layout}, this run trains {layout}")
    else:  # written in layer order; trained in the run's order
        init = to_layout(init, layout)
    theirs = init.state_dict.get("d2t")
    if theirs is None or theirs.shape != vocab.d2t.shape or not torch.equal(theirs.long(), vocab.d2t):
        n = init.config.draft_vocab_size
        if n != vocab.size:
            problems.append(f"its draft vocabulary ({n} ids) is not this run's ({vocab.size} ids "
                            "from the data)")
        else:
            problems.append(f"its draft vocabulary holds other token ids than this run's (both "
                            f"{n}; a run picks its ids from its data: --dataset, --num-prompts, "
                            "--vocab-prompts)")
    mine = model.state_dict()
    for name in sorted(set(mine) | set(init.state_dict)):
        if name not in init.state_dict or name not in mine:
            problems.append(f"{name} is only in {'this run' if name in mine else 'the checkpoint'}")
        elif tuple(mine[name].shape) != tuple(init.state_dict[name].shape):
            problems.append(f"{name} is {list(init.state_dict[name].shape)}, this run's is "
                            f"{list(mine[name].shape)}")
    if problems:
        raise Eagle3Error(f"--init-from {path}: " + "; ".join(problems[:6]) + ". Start from a "
                          "draft trained on the same layout, draft vocabulary and draft shape "
                          "(--intermediate-size, --draft-layers), or drop --init-from.")
    model.load_state_dict({k: v.float() if v.is_floating_point() else v
                           for k, v in init.state_dict.items()}, strict=True)


def _command(args: argparse.Namespace) -> str:
    """The run as an ``eagle3 train`` command line with every setting spelled out."""
    parts = ["eagle3", "train"]
    for name, value in sorted(vars(args).items()):
        if name in ("func", "command", "debug", "verbose") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        for v in value if isinstance(value, list) else [value]:
            parts += [flag] if v is True else [flag, str(v)]
    return shlex.join(parts)


def _round(xs: Any) -> Any:
    """Floats (also inside lists) to 4 decimals; anything else unchanged."""
    if isinstance(xs, list):
        return [_round(x) for x in xs]
    return round(xs, 4) if isinstance(xs, float) else xs


# --------------------------------------------------------------------------- command
def run_train(args: argparse.Namespace) -> int:
    """``eagle3 train``; exit 3 when a resumable run (--checkpoint-dir) ran out of --minutes."""
    try:
        return _run_train(args)
    except Unfinished as exc:
        import sys

        print(f"eagle3 train: unfinished: {exc}. Run the same command again to continue.",
              file=sys.stderr)
        return 3


def _run_train(args: argparse.Namespace) -> int:
    import torch

    from eagle3_backend.checkpoint import LoadedDraft, load_draft, save_sglang
    from eagle3_backend.checkpoint.files import check_destination
    from eagle3_backend.layout import Layout, parse_layout_flag
    from eagle3_backend.target import TargetInfo
    from eagle3_backend.target import target_path as resolve_target
    from eagle3_backend.train.trainer import (
        TrainSettings,
        build_draft,
        evaluate_top1,
        expected_acceptance_length,
        iter_state,
        make_batches,
        reorder_layout,
        split_heldout,
        summarize,
        train_draft,
    )
    from eagle3_backend.train.vocab import build_vocab_map, token_counts
    from eagle3_backend.verify.report import environment, write_text_atomic

    t_start = time.perf_counter()
    for name in ("num_prompts", "max_new_tokens", "max_prompt_tokens", "gen_batch", "threads",
                 "vocab_prompts", "draft_vocab", "teacher_tokens", "max_seq_tokens", "topk",
                 "teacher_batch_tokens", "checkpoint_every", "intermediate_size", "draft_layers",
                 "answer_turn", "steps", "ttt_steps", "batch_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise Eagle3Error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.first_conversation < 0 or (args.first_conversation and args.source == "generated"):
        raise Eagle3Error(f"--first-conversation {args.first_conversation}: a conversation "
                          "index (>= 0) into the teacher-forced data; use it with --source "
                          "teacher (or mix).")
    if args.answers == "target" and args.source == "generated":
        raise Eagle3Error("--answers target chooses the assistant turns of the teacher-forced "
                          "data; use it with --source teacher (or mix).")
    if args.answer_turn != 1 and args.answers != "target":
        raise Eagle3Error(f"--answer-turn {args.answer_turn} chooses which user turn the target "
                          "answers; use it with --answers target.")
    if args.no_chat_template and args.source != "generated":
        raise Eagle3Error(f"--no-chat-template answers raw prompt text; --source {args.source}'s "
                          "teacher-forced chats are rendered through the chat template. Use it "
                          "with --source generated.")
    if args.add_teacher_cache and args.source == "generated":
        raise Eagle3Error("--add-teacher-cache adds teacher-forced data; use it with --source "
                          "teacher (or mix).")
    if args.minutes is not None and not args.minutes > 0:
        raise Eagle3Error(f"--minutes must be > 0, got {args.minutes}.")
    torch.set_num_threads(args.threads)
    # with --checkpoint-dir the schedule never depends on the budget (a sitting may differ)
    epochs = args.epochs or (20.0 if args.minutes and not args.checkpoint_dir else 3.0)
    settings = TrainSettings(ttt_steps=args.ttt_steps, steps=args.steps, epochs=epochs,
                             batch_tokens=args.batch_tokens, lr=args.lr,
                             heldout_fraction=args.heldout_fraction, seed=args.seed)
    out = Path(args.out)
    progress = not args.no_progress
    target_path = resolve_target(args.target)
    # before any work: the checkpoint could not be written there at the end (not empty
    # without --force, other files in it, the target or the data cache in it)
    check_destination(out, args.force, [target_path, args.cache_data, args.teacher_cache,
                                        args.checkpoint_dir, args.init_from,
                                        *(args.add_teacher_cache or [])])
    for flag, value in (("--cache-data", args.cache_data), ("--teacher-cache", args.teacher_cache),
                        ("--checkpoint-dir", args.checkpoint_dir)):
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise Eagle3Error(f"{flag} {value} is a file; expected a directory (created when "
                              "missing). Pass another path.")
    target_info = TargetInfo.from_path(target_path)
    layout = (parse_layout_flag(args.layout, target_info.num_hidden_layers) if args.layout else
              Layout.engine_default("sglang", target_info.num_hidden_layers,
                                    target_info.architecture))
    if args.draft_vocab > target_info.vocab_size:
        print(f"eagle3 train: note: --draft-vocab {args.draft_vocab} is more than the target's "
              f"{target_info.vocab_size} token ids; the draft predicts over all of them.",
              file=sys.stderr)
    budget = args.minutes * 60 if args.minutes else None
    data_deadline = t_start + DATA_SHARE * budget if budget else None
    train_deadline = t_start + (1 - RESERVE_SHARE) * budget if budget else None

    resumable = bool(args.checkpoint_dir)
    train_seqs: list[Any] = []
    held_seqs: list[Any] = []
    data = data_info = None
    embed = lm_head = None
    teacher_info = None
    vocab = None
    counts = held_counts = None
    if args.source in ("generated", "mix"):
        gen_deadline = None if resumable else data_deadline
        data, data_info = _get_data(args, target_path, layout, gen_deadline, progress)
        train_seqs, held_seqs = split_heldout(data.sequences, settings.heldout_fraction, args.seed)
        embed, lm_head = data.embed, data.lm_head
        counts = token_counts([s.tokens[s.prompt_len:] for s in train_seqs], data.vocab_size)
        vocab = build_vocab_map(counts, min(args.draft_vocab, data.vocab_size), data.prior_counts)
        held_counts = token_counts([s.tokens[s.prompt_len:] for s in held_seqs], data.vocab_size)
    if args.source in ("teacher", "mix"):
        from eagle3_backend.train.teacher import heldout_conversation
        from eagle3_backend.train.trainer import to_topk
        from eagle3_backend.train.vocab import VocabMap

        seqs, draft_ids, embed, teacher_info = _teacher_data(
            args, target_path, layout, data_deadline if not resumable else train_deadline,
            progress)
        vocab = VocabMap(draft_ids, int(embed.shape[0]))
        if train_seqs or held_seqs:          # mix: the answers get top-k teachers too
            head = lm_head[vocab.target_ids].float()
            train_seqs, held_seqs = to_topk(train_seqs, head, args.topk), to_topk(held_seqs, head, args.topk)
        for s in seqs:
            (held_seqs if heldout_conversation(s.id, settings.heldout_fraction)
             else train_seqs).append(s)
        V = int(embed.shape[0])
        counts = token_counts([s.tokens[s.assistant_mask()] for s in train_seqs], V)
        held_counts = token_counts([s.tokens[s.assistant_mask()] for s in held_seqs], V)
        if data is None:
            from eagle3_backend.train.data import TrainingData

            data = TrainingData(layout=layout, sequences=[], embed=embed, lm_head=None,
                                final_norm=None, meta={})
            data_info = {"source": "teacher"}
        else:
            data_info = {**data_info, "source": "mix"}
    t_data = time.perf_counter()
    cfg = _draft_config(target_info, layout, vocab.size, args.dtype, args.intermediate_size,
                        args.draft_layers)
    torch.manual_seed(args.seed)
    model = build_draft(cfg, data, vocab, seed=args.seed)
    if args.init_from:
        _init_from(model, Path(args.init_from), target_info, layout, vocab, args.allow_pickle)
    import hashlib

    identity = {"layout": layout.to_strings(), "draft_vocab": vocab.target_ids.tolist(),
                "data": hashlib.sha256(json.dumps(
                    [[s.id, int(s.tokens.shape[0])] for s in train_seqs + held_seqs]
                ).encode()).hexdigest(), "dtype": args.dtype,
                "intermediate_size": cfg.intermediate_size, "layers": cfg.num_hidden_layers,
                "init_from": str(Path(args.init_from).resolve()) if args.init_from else None}
    result = train_draft(model, train_seqs, held_seqs, vocab, lm_head, settings,
                         deadline=train_deadline, progress=progress,
                         checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                         eval_every=args.eval_every, identity=identity)
    if not result.finished:
        raise Unfinished(f"training stopped at the --minutes budget at step "
                         f"{result.steps_done} of {settings.steps or 'the planned'} "
                         f"(checkpoint in {args.checkpoint_dir})")
    t_train = time.perf_counter()

    state = dict(iter_state(result.model, cfg.torch_dtype))
    loaded = LoadedDraft(
        path=str(out), format="sglang", config=cfg, state_dict=state, layout_source="explicit",
        layout_explanation=f"trained by eagle3 train on layout {layout}",
        target_architecture=target_info.architecture,
        target_num_layers=target_info.num_hidden_layers,
    )
    save_sglang(loaded, out, target=target_info, force=args.force, sources=[args.cache_data])
    # the report's held-out numbers are those of the weights as written (dtype cast)
    written = load_draft(out, target=target_info, strict=True)
    from eagle3_backend.model import Eagle3DraftModel

    reread = Eagle3DraftModel(dataclasses.replace(written.config, dtype="float32"))
    reread.load_state_dict({k: v.float() if v.is_floating_point() else v
                            for k, v in written.state_dict.items()}, strict=True)
    reread.set_target_embedding(embed)
    head = lm_head[vocab.target_ids].float() if lm_head is not None else None
    held_written = reorder_layout(held_seqs, layout, written.config.layout)
    held_batches = make_batches(held_written, settings.batch_tokens, settings.ttt_steps)
    held_saved = (evaluate_top1(reread, held_batches, vocab, head, settings.ttt_steps)
                  if held_batches else None)
    t_end = time.perf_counter()

    summary = summarize(result)
    held_top1 = held_saved.top1() if held_saved else None
    report: dict[str, Any] = {
        **environment(),
        # the train command that reproduces this draft, not this process's argv (a test
        # runner, a wrapper script): it replaces environment()'s "command"
        "command": _command(args),
        "target": str(target_path),
        "layout": layout.to_strings(),
        "dataset": args.dataset,
        "data": {**data_info, **{k: v for k, v in data.meta.items() if k != "ids"},
                 "sequences": len(train_seqs) + len(held_seqs),
                 "answer_tokens": sum(s.answer_len for s in train_seqs + held_seqs),
                 "total_tokens": sum(int(s.tokens.shape[0]) for s in train_seqs + held_seqs),
                 **({"teacher": teacher_info} if teacher_info else {})},
        "draft_vocab": {"size": vocab.size, "train_coverage": round(vocab.coverage(counts), 4),
                        "heldout_coverage": round(vocab.coverage(held_counts), 4)},
        "training": {**{k: _round(v) for k, v in summary.items()},
                     "settings": dataclasses.asdict(settings)},
        "heldout_top1_by_position": _round(held_top1),
        "heldout_loss_by_position": _round(held_saved.mean_loss() if held_saved else None),
        "heldout_expected_acceptance_length": _round(
            expected_acceptance_length(held_top1) if held_top1 else None),
        # what eagle3 eval would measure on the held-out prompts (chain of --ttt-steps):
        # None when no held-out answer is the target's own text
        "heldout_chain_acceptance_length": _round(held_saved.chain_acceptance() if held_saved else None),
        "checkpoint": {"path": str(out), "dtype": args.dtype,
                       "parameters": loaded.num_parameters, "has_embed_tokens": False},
        "wall_seconds": {"data": round(t_data - t_start, 2), "train": round(t_train - t_data, 2),
                         "write_and_heldout": round(t_end - t_train, 2),
                         "total": round(t_end - t_start, 2)},
        "threads": args.threads,
        "minutes_budget": args.minutes,
    }
    # The report marks a finished run (`make draft` reuses a DIR that has one): written last,
    # atomically.
    write_text_atomic(out / REPORT_NAME, json.dumps(report, indent=2) + "\n")
    _print_summary(report)
    return 0


def _print_summary(r: dict[str, Any]) -> None:
    d, t = r["data"], r["training"]
    fmt = lambda xs: ", ".join("-" if x is None else f"{x:.3f}" for x in xs) if xs else "-"  # noqa: E731
    print(f"wrote {r['checkpoint']['path']} ({r['checkpoint']['parameters']:,} weights, "
          f"{r['checkpoint']['dtype']}, layout [{', '.join(r['layout'])}])")
    print(f"  data: {d['sequences']} answers, {d['answer_tokens']:,} answer tokens "
          f"({d['source']}), draft vocab {r['draft_vocab']['size']} covers "
          f"{r['draft_vocab']['heldout_coverage']:.1%} of held-out answer tokens")
    print(f"  training: {t['steps']} steps in {t['train_seconds']:.0f} s (weights of step "
          f"{t['best_step']}), loss {t['loss_first']} -> {t['loss_last']}; train top-1 by "
          f"position [{fmt(t['train_top1_by_position'])}]")
    chain = r["heldout_chain_acceptance_length"]
    print(f"  held-out top-1 by position [{fmt(r['heldout_top1_by_position'])}]; chain acceptance "
          f"length {r['heldout_expected_acceptance_length']} if positions were independent"
          + (f", {chain} replayed on the target's answers (SGLang's accept length: the "
             f"prefill's token counts too)" if chain is not None else ""))
    w = r["wall_seconds"]
    print(f"  wall: data {w['data']:.0f} s, train {w['train']:.0f} s, total {w['total']:.0f} s; "
          f"report {Path(r['checkpoint']['path']) / REPORT_NAME}")
