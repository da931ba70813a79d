"""Offline speculative decoding: a transformers target verifies this project's draft.

Batch size 1, one request at a time, the reference of what SGLang's EAGLE-3
worker does:

    prefill   target(prompt) -> first token x, layout states of every prompt position
    loop      draft: extend with the tokens committed last round (paired with the
                     target states one position earlier), then draft a tree/chain
              verify: one target forward over [root, drafted nodes] with a tree mask
              accept: greedy (temperature 0) = longest path matching the target's
                      argmax; temperature > 0 = rejection sampling (exact law)
              commit: accepted nodes + one target token (the "bonus"); the target KV
                      cache keeps only the prefix and the accepted rows

Temperature 0 commits exactly the tokens :func:`generate_target_only` produces
(up to floating-point ties: in fp32 the outputs are identical; in bf16 a k-token
verify forward rounds differently from a 1-token decode, so the two can part).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3_backend.errors import TargetError
from eagle3_backend.model import Eagle3DraftModel
from eagle3_backend.ops.reference import greedy_path
from eagle3_backend.verify.metrics import STEP_PHASES
from eagle3_backend.verify.sampling import (
    chain_speculative_sampling,
    probs_from_logits,
    sample_from_probs,
    tree_speculative_sampling,
)
from eagle3_backend.verify.targets import HiddenCapture, Target
from eagle3_backend.verify.tree import DraftTree, SpecSettings, draft_tree

logger = logging.getLogger(__name__)

# Where a request's seconds go. Target-only: the prompt's forward, then one forward a token.
# Speculative: the prompt's forward, then the phases of every verify step.
PHASES = {"target-only": ("prefill", "decode"), "speculative": ("prefill", *STEP_PHASES)}

__all__ = [
    "PHASES",
    "GenerationResult",
    "SpeculativeEngine",
    "attach_draft",
    "generate_target_only",
    "keep_cache_rows",
    "load_draft_model",
    "verify_greedy",
]


@dataclass(slots=True)
class GenerationResult:
    """One request's output and counters.

    ``accepted_per_step[i]`` = draft tokens accepted by verify step i (the bonus
    token not counted); ``verify_steps == len(accepted_per_step)``. ``phases``: where
    ``seconds`` went, by :data:`PHASES` (each phase ends on a device synchronisation; what
    the loop spends outside them is not in any).
    """

    tokens: list[int]
    seconds: float
    prompt_tokens: int
    verify_steps: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


# --------------------------------------------------------------------------- target side
def _causal_lm_forward(
    target: Target,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: Any,
    mask: torch.Tensor | None = None,
    last_only: bool = False,
) -> torch.Tensor:
    """Target forward; returns logits [T, V] (or [1, V] with ``last_only``).

    input_ids, positions: [1, T]; mask: bool [T, L+T] over the L cached keys (positions
    0..L-1) and the T new ones (True = attend), or None for transformers' own causal (and
    sliding-window) masks.
    """
    kwargs: dict[str, Any] = {}
    if mask is not None:
        kwargs["attention_mask"] = _tree_attention_masks(target, mask, positions[0])
    out = target.model(
        input_ids=input_ids,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1 if last_only else 0,
        **kwargs,
    )
    return out.logits[0]


# what the verifier can roll back: layer type -> the transformers cache layer it gets
_ROLLBACK_LAYERS = {"full_attention": "DynamicLayer", "sliding_attention": "DynamicSlidingWindowLayer"}
_kinds_memo: list[Any] = [None, None]   # [the last config asked, its attention kinds]


def _attention_kinds(config: Any) -> tuple[tuple[str, ...], int | None]:
    """The target's attention layer types as transformers reads them from ``config`` (one per
    cached layer) and the sliding window of its ``sliding_attention`` layers (None without).
    Memoized for the last config: transformers takes about 0.4 ms to read 30 layers."""
    if _kinds_memo[0] is config:
        return _kinds_memo[1]
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types, per_layer = get_layer_types_and_kwargs(text)
    windows = {kw["sliding_window"] for t, kw in zip(types, per_layer) if t == "sliding_attention"}
    if len(windows) > 1:
        raise TargetError(f"target layers have sliding windows {sorted(windows)}; the offline "
                          "verifier takes one window size. Serve it with SGLang instead.")
    kinds = (tuple(types), windows.pop() if windows else None)
    _kinds_memo[:] = [config, kinds]
    return kinds


def _new_cache(target: Target, capacity: int = 256) -> Any:
    """A transformers DynamicCache for ``target`` whose layers are :func:`in_place_layer` ones
    with room for ``capacity`` positions (more when needed), their keys and values slices of one
    allocation where the layers' shapes agree. A sliding-window layer keeps every position too
    and its window is applied by the masks (transformers' own for a prefill or a decode,
    :func:`_tree_attention_masks` for a tree), so that a rollback never loses a key a later
    token sees. Raises TargetError for a layer kind that cannot be rolled back."""
    from transformers import DynamicCache

    cache = DynamicCache(config=target.model.config)
    types, _ = _attention_kinds(target.model.config)
    for i, layer in enumerate(cache.layers):
        kind = types[i] if i < len(types) else "?"
        if _ROLLBACK_LAYERS.get(kind) != type(layer).__name__:
            raise TargetError(
                f"target {target.path!r}: layer {i} has {kind} ({type(layer).__name__} "
                "cache); the offline verifier rolls back full-attention and sliding-window "
                "layers only. Serve this target with SGLang and measure it with eagle3 bench.")
    layer_class = in_place_layer()
    arena = _Arena(len(cache.layers), capacity)
    for slot in range(len(cache.layers)):
        cache.layers[slot] = layer_class(capacity, arena, slot)
    return cache


def _tree_attention_masks(target: Target, mask: torch.Tensor, positions: torch.Tensor,
                          ) -> "torch.Tensor | dict[str, torch.Tensor]":
    """transformers' additive attention mask [1, 1, T, L+T] for a tree verify from the bool
    ``mask`` [T, L+T] (True = attend) and the new tokens' positions [T]. A target with
    sliding-window layers gets them their own: a key is seen only while it is less than the
    window behind the query's position, counted in positions (a tree node's is its depth past
    the root), so each node sees exactly the keys its decode would; a target that mixes both
    kinds gets a mask per layer type, as its forward takes them."""
    def additive(m: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros(m.shape, dtype=target.dtype, device=m.device)
        return bias.masked_fill_(~m, torch.finfo(target.dtype).min)[None, None]

    types, window = _attention_kinds(target.model.config)
    if window is None:
        return additive(mask)
    new = positions.to(mask.device)
    keys = torch.cat([torch.arange(mask.shape[1] - new.numel(), device=mask.device), new])
    slid = additive(mask & (keys[None, :] > new[:, None] - window))
    if set(types) == {"sliding_attention"}:
        return slid
    return {"full_attention": additive(mask), "sliding_attention": slid}


class _Arena:
    """Storage [layers, 2, B, Hkv, capacity, D] shared by a cache's in-place layers, so that a
    rollback moves the accepted rows of every layer in one copy (:func:`keep_cache_rows`)
    instead of four small ops a layer. A layer whose keys differ in shape, dtype or device
    from the first one's (or from its values) gets buffers of its own."""

    def __init__(self, layers: int, capacity: int) -> None:
        self.layers, self.capacity = layers, capacity
        self.storage: torch.Tensor | None = None

    def buffers(self, slot: int, key: torch.Tensor, value: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
        shape = (*key.shape[:2], self.capacity, key.shape[-1])
        if value.shape != key.shape or value.dtype != key.dtype or value.device != key.device:
            return None
        if self.storage is None:
            self.storage = key.new_empty((self.layers, 2, *shape))
        elif (self.storage.shape[2:] != shape or self.storage.dtype != key.dtype
              or self.storage.device != key.device):
            return None
        return self.storage[slot, 0], self.storage[slot, 1]

    @staticmethod
    def holding(layers: list[Any]) -> "_Arena | None":
        """The arena whose storage holds all of ``layers`` (initialized cache layers) and no
        other layer's rows, else None."""
        arena = getattr(layers[0], "arena", None)
        if arena is None or arena.storage is None or len(layers) != arena.layers:
            return None
        if all(getattr(layer, "arena", None) is arena and layer.shared for layer in layers):
            return arena
        return None


@functools.cache
def in_place_layer() -> type:
    """transformers' ``DynamicLayer`` without the copies: its keys and values are views of
    buffers allocated once per request, a forward writes its T new positions into them,
    and a rollback moves only the accepted rows. transformers' own layer concatenates the
    whole cache onto the new rows in every layer on every forward (``torch.cat``), and
    slicing it back after a verify leaves a strided view that the next ``cat`` copies again.
    Same keys and values, so the same logits (tested)."""
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        def __init__(self, capacity: int, arena: _Arena | None = None, slot: int = 0) -> None:
            super().__init__()
            self.capacity = max(1, int(capacity))
            self.arena, self.slot = arena, slot
            self.shared = False   # whether the buffers are slices of ``arena.storage``

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.dtype, self.device = key_states.dtype, key_states.device
            shared = (self.arena.buffers(self.slot, key_states, value_states)
                      if self.arena is not None and self.arena.capacity == self.capacity else None)
            self.shared = shared is not None
            self._buffers = shared or tuple(
                x.new_empty((*x.shape[:2], self.capacity, x.shape[-1]))
                for x in (key_states, value_states))
            self.keys, self.values = (b[..., :0, :] for b in self._buffers)
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.keys.shape[-2]
            end = start + key_states.shape[-2]
            if end > self._buffers[0].shape[-2]:
                self.capacity = max(end, 2 * self.capacity)
                self._buffers = tuple(torch.cat([b[..., :start, :], b.new_empty(
                    (*b.shape[:2], self.capacity - start, b.shape[-1]))], dim=-2)
                    for b in self._buffers)
                self.shared = False
            for b, x in zip(self._buffers, (key_states, value_states)):
                b[..., start:end, :].copy_(x)
            self.keys, self.values = (b[..., :end, :] for b in self._buffers)
            return self.keys, self.values

        def keep_rows(self, prefix_len: int, rows: list[int],
                      index: torch.Tensor | None = None) -> None:
            """Keep positions ``[0, prefix_len)`` and then ``prefix_len + r`` for r in rows
            (ascending): each kept row moves down in place (never onto a later one).
            ``index``: ``prefix_len + rows`` as a tensor, or None when the rows are already in
            place (rows == 0, 1, ..; or moved for every layer at once)."""
            end = prefix_len + len(rows)
            if index is not None:
                for b in self._buffers:
                    b[..., prefix_len:end, :] = b.index_select(-2, index)
            self.keys, self.values = (b[..., :end, :] for b in self._buffers)

    return InPlaceLayer


def keep_cache_rows(cache: Any, prefix_len: int, rows: list[int]) -> None:
    """Keep the first ``prefix_len`` positions of a transformers DynamicCache and,
    after them, the positions ``prefix_len + r`` for r in ``rows`` (ascending)."""
    from transformers.cache_utils import DynamicLayer

    contiguous = rows == list(range(len(rows)))
    in_place = in_place_layer()
    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, in_place):
            raise TargetError(
                f"target KV cache layer {type(layer).__name__} cannot be rolled back to the "
                "accepted tokens; the offline verifier rolls back full-attention layers "
                "(DynamicLayer) and the caches it makes itself (_new_cache: sliding-window "
                "layers kept whole). Linear-attention and other layers are not supported."
            )
    layers = [layer for layer in cache.layers if layer.is_initialized]
    index, full, moved = None, None, False
    if not contiguous and layers:
        index = prefix_len + torch.tensor(rows, dtype=torch.long, device=layers[0].keys.device)
        arena = _Arena.holding(layers)
        if arena is not None:                          # every layer's rows in one move
            arena.storage[..., prefix_len:prefix_len + len(rows), :] = \
                arena.storage.index_select(-2, index)
            moved = True
    for layer in layers:
        if type(layer) is in_place:
            layer.keep_rows(prefix_len, rows,
                            None if contiguous or moved else index)
            continue
        if contiguous:
            end = prefix_len + len(rows)
            layer.keys = layer.keys[..., :end, :]
            layer.values = layer.values[..., :end, :]
            continue
        if full is None or full.device != layer.keys.device:    # made once, not per layer
            full = torch.cat([torch.arange(prefix_len, device=layer.keys.device),
                              index.to(layer.keys.device)])
        layer.keys = layer.keys.index_select(-2, full)
        layer.values = layer.values.index_select(-2, full)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> int:
    """Next token from logits [V]: argmax at temperature 0, else a sample."""
    if temperature == 0:
        return int(logits.argmax())
    return int(sample_from_probs(probs_from_logits(logits, temperature), gen))


def _check_length(target: Target, total: int) -> None:
    limit = getattr(target.model.config, "max_position_embeddings", None)
    if limit is not None and total > limit:
        raise TargetError(
            f"prompt + new tokens + draft tokens = {total} positions exceed the target's "
            f"max_position_embeddings {limit}. Lower --max-new-tokens or use shorter prompts."
        )


@torch.inference_mode()
def generate_target_only(
    target: Target,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> GenerationResult:
    """Plain autoregressive decoding with a KV cache: the baseline."""
    device = target.device
    eos = target.eos_token_ids
    _check_length(target, len(prompt_ids) + max_new_tokens)
    gen = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
    _sync(device)
    t0 = time.perf_counter()
    cache = _new_cache(target, len(prompt_ids) + max_new_tokens)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    pos = torch.arange(len(prompt_ids), device=device)[None]
    logits = _causal_lm_forward(target, ids, pos, cache, last_only=True)
    out = [_pick(logits[-1], temperature, gen)]
    t1 = time.perf_counter()
    while len(out) < max_new_tokens and out[-1] not in eos:
        p = len(prompt_ids) + len(out) - 1
        ids = torch.tensor([[out[-1]]], dtype=torch.long, device=device)
        pos = torch.tensor([[p]], device=device)
        logits = _causal_lm_forward(target, ids, pos, cache)
        out.append(_pick(logits[-1], temperature, gen))
    _sync(device)
    t2 = time.perf_counter()
    return GenerationResult(tokens=out, seconds=t2 - t0, prompt_tokens=len(prompt_ids),
                            phases={"prefill": t1 - t0, "decode": t2 - t1})


# --------------------------------------------------------------------------- verification
def verify_greedy(tree: DraftTree, target_predict: torch.Tensor) -> tuple[list[int], int]:
    """Greedy acceptance over a tree, SGLang's ``verify_tree_greedy`` contract.

    target_predict [N]: the target's argmax after each node. Returns (accepted
    nodes, root first; the target token after the last one = the bonus). On the host the
    reference's walk runs on Python lists (one request: a few list reads, where the op's
    tensors cost a dozen small allocations); on a GPU the ``verify_tree_greedy`` op does.
    """
    if target_predict.device.type == "cpu":
        predict = target_predict.tolist()
        rows = greedy_path(tree.tokens.tolist(), tree.first_child, tree.next_sibling, predict,
                           tree.max_depth + 1)
        return rows, predict[rows[-1]]
    from eagle3_backend.ops import verify_tree_greedy as verify

    n = len(tree)
    dev = target_predict.device
    as_row = lambda xs: torch.tensor([list(xs)], dtype=torch.long, device=dev)  # noqa: E731
    predicts = torch.full((n,), -1, dtype=torch.int32, device=dev)
    accept_index = torch.full((1, tree.max_depth + 1), -1, dtype=torch.int32, device=dev)
    accept_num = torch.zeros(1, dtype=torch.int32, device=dev)
    verify(
        predicts, accept_index, accept_num,
        tree.tokens.to(dev)[None], as_row(range(n)),
        as_row(tree.first_child), as_row(tree.next_sibling),
        target_predict.long()[None],
    )
    k = int(accept_num[0])
    rows = accept_index[0, : k + 1].tolist()
    return rows, int(predicts[rows[-1]])


# --------------------------------------------------------------------------- draft side
def load_draft_model(path: str | Path, target: Target | None = None,
                     device: str | torch.device = "cpu",
                     dtype: torch.dtype | None = None, *,
                     loaded: Any = None) -> Eagle3DraftModel:
    """Read a draft checkpoint (any format :func:`eagle3_backend.checkpoint.load_draft`
    reads) into an :class:`Eagle3DraftModel`. ``target`` supplies the architecture and
    layer count a checkpoint may not record. ``loaded``: the checkpoint at ``path`` already
    read by ``load_draft`` against this target (not read again; the model gets its own
    copy of the weights)."""
    from eagle3_backend.checkpoint import load_draft
    from eagle3_backend.target import TargetInfo

    if loaded is None:
        info = TargetInfo.from_path(target.path) if target is not None else None
        loaded = load_draft(path, target=info)
    model = Eagle3DraftModel(loaded.config)
    model.load_state_dict(dict(loaded.state_dict))  # names and shapes checked by the reader
    for warning in loaded.warnings:
        logger.warning("draft %s: %s", path, warning)
    model = model.to(device=device, dtype=dtype or loaded.config.torch_dtype).eval()
    if model.fc.weight.device.type == "cpu":
        from eagle3_backend.cpu.layer_ops import fuse_draft
        from eagle3_backend.cpu.small_gemm import few_row_linears

        fuse_draft(model)        # norms and rotary: one kernel call each
        if model.fc.weight.dtype == torch.float32:
            few_row_linears(model)   # a bf16 checkpoint's layers then stream their bf16 copies
    return model


def attach_draft(draft: Eagle3DraftModel, target: Target) -> Eagle3DraftModel:
    """Check a draft against its target (the check suite's :func:`check_config`) and share
    the target's embedding as SGLang does (``set_embed`` when the hidden sizes are equal)."""
    from eagle3_backend.checkpoint.suite import check_config, refusal
    from eagle3_backend.target import TargetInfo

    archs = getattr(getattr(target.model, "config", None), "architectures", None) or ["?"]
    info = TargetInfo(architecture=str(archs[0]), model_type="", source=str(target.path),
                      num_hidden_layers=target.num_layers, hidden_size=target.hidden_size,
                      vocab_size=target.vocab_size)
    error = refusal(check_config(draft.config, info), what=f"the draft on {target.path}")
    if error is not None:
        raise error
    if draft.config.hidden_size == target.hidden_size:
        draft.set_target_embedding(target.model.get_input_embeddings().weight)
    return draft


# --------------------------------------------------------------------------- the engine
class SpeculativeEngine:
    """Target + draft, speculative generation of one request at a time."""

    def __init__(self, target: Target, draft: Eagle3DraftModel, settings: SpecSettings,
                 sampling_backend: str = "auto") -> None:
        self.target = target
        self.draft = attach_draft(draft, target)
        self.settings = settings
        self.layout = draft.config.layout
        self.sampling_backend = sampling_backend

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> GenerationResult:
        target, s = self.target, self.settings
        device = target.device
        eos = target.eos_token_ids
        n = len(prompt_ids)
        _check_length(target, n + max_new_tokens + s.speculative_num_draft_tokens)
        gen = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
        accepted_per_step: list[int] = []
        phases = dict.fromkeys(PHASES["speculative"], 0.0)
        _sync(device)
        t0 = time.perf_counter()
        with HiddenCapture(target.model, self.layout) as capture:
            cache = _new_cache(target, n + max_new_tokens + s.speculative_num_draft_tokens)
            ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
            logits = _causal_lm_forward(target, ids, torch.arange(n, device=device)[None],
                                        cache, last_only=True)
            aux = capture.take()[0]                                     # [n, K*Ht]
            out = [_pick(logits[-1], temperature, gen)]
            draft_cache = self.draft.new_cache(
                1, n + max_new_tokens + 2 * s.speculative_num_steps * s.speculative_eagle_topk + 2)
            ext_ids = prompt_ids[1:] + out                              # pairs (x_{i+1}, h_i)
            ext_hidden = aux
            marks = [time.perf_counter()]                               # phase boundaries
            phases["prefill"] = marks[0] - t0
            while len(out) < max_new_tokens and out[-1] not in eos:
                marks = marks[-1:]
                tree = self._propose(out, ext_ids, ext_hidden, draft_cache)
                _sync(device)
                marks.append(time.perf_counter())
                prefix = n + len(out) - 1                               # root position
                positions = prefix + torch.tensor(tree.depths, device=device)[None]
                logits = _causal_lm_forward(target, tree.tokens[None].to(device), positions,
                                            cache, mask=tree.attention_mask(prefix, device))
                aux = capture.take()[0]                                 # [N, K*Ht]
                _sync(device)
                marks.append(time.perf_counter())
                rows, next_token = self._accept(tree, logits, temperature, gen)
                keep_cache_rows(cache, prefix, rows)
                new = tree.tokens[rows[1:]].tolist() + [next_token]
                accepted_per_step.append(len(rows) - 1)
                out.extend(new)
                _sync(device)
                marks.append(time.perf_counter())
                for name, start, end in zip(STEP_PHASES, marks, marks[1:]):
                    phases[name] += end - start
                if not eos.isdisjoint(new):  # an accepted draft token may be the eos
                    break
                ext_ids, ext_hidden = new, aux[rows]
        _sync(device)
        seconds = time.perf_counter() - t0
        return GenerationResult(
            tokens=_truncate(out, max_new_tokens, eos), seconds=seconds, prompt_tokens=n,
            verify_steps=len(accepted_per_step), accepted_per_step=accepted_per_step,
            phases=phases,
        )

    def _propose(self, out: list[int], ext_ids: list[int], ext_hidden: torch.Tensor,
                 draft_cache: Any) -> DraftTree:
        """The verify tree rooted at ``out[-1]``; ext_ids / ext_hidden [T, K*Ht]: the tokens
        committed since the last call and the target states one position before each."""
        ids = torch.tensor([ext_ids], dtype=torch.long, device=self.target.device)
        return draft_tree(self.draft, self.settings, out[-1], ids, ext_hidden[None], draft_cache)

    def _accept(self, tree: DraftTree, logits: torch.Tensor, temperature: float,
                gen: torch.Generator | None) -> tuple[list[int], int]:
        """Accepted node rows (root first) and the token committed after them."""
        if temperature == 0:
            return verify_greedy(tree, logits.argmax(dim=-1))
        probs = probs_from_logits(logits, temperature)                  # [N, V]
        if self.settings.is_chain and probs.device.type == "cuda":
            drafts = tree.tokens[1:].to(probs.device)[None]             # [1, S]
            onehot = torch.nn.functional.one_hot(drafts, probs.shape[-1]).float()
            out, emitted = chain_speculative_sampling(onehot, drafts, probs[None], gen,
                                                      backend=self.sampling_backend)
            k = int(emitted[0])
            return list(range(k + 1)), int(out[0, k])
        return tree_speculative_sampling(probs, tree.tokens.tolist(), tree.first_child,
                                         tree.next_sibling, gen)


def _truncate(tokens: list[int], max_new_tokens: int, eos: frozenset[int]) -> list[int]:
    out = tokens[:max_new_tokens]
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out
