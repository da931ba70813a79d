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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
