"""Refuse requests that would stop the server, with an HTTP 400 that says why.

SGLang 0.5.23 passes three kinds of request straight to the model, where they
raise inside the scheduler process and take the whole server down (every
request in flight is lost):

* an empty prompt (``"text": ""``, alone or in a batch, with a tokenizer that
  adds no BOS): a 0-token prefill fails in the target forward;
* a token id outside the vocabulary (``"input_ids": [1000000000]`` or a
  negative id): the embedding lookup indexes out of range (on a GPU, a
  device-side assert that poisons the CUDA context);
* ``top_logprobs_num`` larger than the vocabulary: ``topk`` over the
  logprobs fails in the sampler.

The handler runs BEFORE ``TokenizerManager._validate_one_request`` in the
launcher process, where SGLang turns a ValueError into a 400 response, the
same way it reports a prompt longer than the context. Requests with
multimodal data or input embeddings carry placeholder ids that are not
vocabulary ids and are left to SGLang.

A fourth kind does not stop the server but loses the whole answer: a request
whose prompt plus ``max_new_tokens`` reaches the KV pool (a long prompt, or
an OpenAI client that leaves ``max_tokens`` unset). The scheduler clips
``max_new_tokens`` to what one decode token a step needs (the target-only
reserve), but every EAGLE-3 decode step reserves ``2 x max(steps x topk,
num_draft_tokens)`` slots past the committed length (8 for steps 3, topk 1,
4 draft tokens). Near the end of the pool the lone request then fails
``check_decode_mem``, ``retract_decode`` aborts it and the client gets HTTP 500
"Out of memory even after retracting all other requests" with no tokens,
where the target-only server answers with ``finish_reason`` length. In the
scheduler of an EAGLE-3 launch, :func:`after_init_req_max_new_tokens` clips
again with that reserve counted, so such a request finishes with ``length``
a few tokens earlier than the target-only server would.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

_MULTIMODAL_FIELDS = ("image_data", "video_data", "audio_data", "input_embeds")


def prompt_problem(obj: Any, input_ids: Sequence[int] | None, vocab_size: int) -> str | None:
    """Why this tokenized request cannot be served, or None when it can."""
    top = getattr(obj, "top_logprobs_num", None)
    if isinstance(top, int) and not isinstance(top, bool) and top > vocab_size:
        return (f"top_logprobs_num is {top}, larger than the model's vocabulary ({vocab_size} "
                f"tokens); ask for at most {vocab_size} top logprobs.")
    if input_ids is None or any(getattr(obj, name, None) is not None for name in _MULTIMODAL_FIELDS):
        return None
    if len(input_ids) == 0:
        return ("The prompt is empty (0 tokens after tokenization). Send at least one token: "
                "non-empty text, or input_ids with one or more ids.")
    for position, token in enumerate(input_ids):
        if not isinstance(token, int) or isinstance(token, bool):
            return (f"input_ids[{position}] is {token!r} ({type(token).__name__}); input_ids must be a "
                    f"list of integer token ids in [0, {vocab_size}).")
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        return (f"input_ids contains token id {bad} at position {list(input_ids).index(bad)}, outside "
                f"the model's vocabulary [0, {vocab_size}). Tokenize with this model's tokenizer.")
    return None


def before_validate_one_request(*args: Any, **kwargs: Any) -> None:
    """BEFORE TokenizerManager._validate_one_request(self, obj, input_ids)."""
    manager = args[0] if args else kwargs["self"]
    obj = args[1] if len(args) > 1 else kwargs.get("obj")
    input_ids = args[2] if len(args) > 2 else kwargs.get("input_ids")
    problem = prompt_problem(obj, input_ids, int(manager.model_config.vocab_size))
    if problem is not None:
        raise ValueError(problem)
    return None


def speculative_max_new_tokens(allocator: Any, input_len: int, max_new_tokens: int, reserve: int, *,
                               token_capacity: int, sliding_window_size: int | None,
                               chunk_size: int | None) -> int:
    """``max_new_tokens`` clipped so that the last decode step still has ``reserve`` free slots.

    SGLang's own clip, ``allocator.max_new_tokens_for_memory``, asked for a prompt ``reserve``
    tokens longer: every allocator (paged, sliding-window, hybrid) keeps its own accounting.
    """
    budget = allocator.max_new_tokens_for_memory(
        input_len + reserve, max_new_tokens, token_capacity=token_capacity,
        sliding_window_size=sliding_window_size, chunk_size=chunk_size)
    return max(0, min(max_new_tokens, 0 if budget is None else budget))


def after_init_req_max_new_tokens(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER Scheduler.init_req_max_new_tokens(self, req): count the speculative decode reserve."""
    from eagle3_backend.serving import hooks

    scheduler = args[0] if args else kwargs["self"]
    req = args[1] if len(args) > 1 else kwargs["req"]
    params = req.sampling_params
    if (params.max_new_tokens is None or getattr(req, "finished_reason", None) is not None
            or getattr(req, "to_finish", None) is not None):  # SGLang aborted it already
        return None
    reserve = int(hooks.use("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode")())
    widening = int(getattr(scheduler, "kv_shard_widening", 1))
    page_size = int(scheduler.page_size)
    # the token capacity SGLang's init_req_max_new_tokens clips against (same expression)
    capacity = int(scheduler.max_total_num_tokens) * widening - page_size * (widening - 1)
    clipped = speculative_max_new_tokens(
        scheduler.token_to_kv_pool_allocator, len(req.origin_input_ids), int(params.max_new_tokens),
        reserve, token_capacity=capacity, sliding_window_size=scheduler.sliding_window_size,
        chunk_size=scheduler.chunked_prefill_size)
    if clipped == 0 < params.max_new_tokens:
        # SGLang's clip left room for 1-token decode steps only: the request would come back
        # empty with finish reason "length" and no word why
        hooks.use("sglang.srt.managers.schedule_batch.Req.set_finish_with_abort")(
            req, f"eagle3_backend: the prompt ({len(req.origin_input_ids)} tokens) leaves no room "
                 f"for an EAGLE-3 decode step in the {capacity}-token KV pool: each step reserves "
                 f"{reserve} slots past the tokens kept, so not one new token fits. Shorten the "
                 f"prompt, or start the server with a larger --max-total-tokens.")
        return None
    if clipped < params.max_new_tokens:
        logger.debug("request %s: max_new_tokens %d -> %d (EAGLE-3 decode reserve %d of a %d-token "
                     "KV pool)", req.rid, params.max_new_tokens, clipped, reserve, capacity)
        params.max_new_tokens = clipped
        if params.min_new_tokens > clipped:
            params.min_new_tokens = clipped
    return None
