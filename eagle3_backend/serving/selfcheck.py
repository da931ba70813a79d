"""Warm-up self-check: the fc input of the first real forward is what the layout says.

Two facts are checked on the first extend (prefill) batch the target runs:

* the ``embed`` slot, if the layout has one, equals the target's embedding of
  the input ids, row for row and bit for bit;
* no two slots are identical (two sources captured as one state, or a slot
  never written).

On success one line is logged (with an embed slot, how many of the tokens fell in this
rank's vocabulary shard)::

    EAGLE-3 layout [embed, layer_input:3, layer_input:31] -> fc input 21504 (checked); embed slot on this rank's vocabulary shard [0, 20352): 17 of 24 tokens

On failure the scheduler stops with a LayoutMismatch. Tensor parallel: the
embedding is vocabulary-sharded, so each rank compares the rows of the tokens
in its own shard (no collective; all ranks together cover every token).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from eagle3_backend.errors import LayoutMismatch
from eagle3_backend.layout import Layout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EmbeddingShard:
    """This rank's rows of the target embedding: ids [start, end) are rows [0, end - start)."""

    weight: torch.Tensor  # [V_local(+padding), H]
    start: int
    end: int

    @classmethod
    def of(cls, embed: object) -> "EmbeddingShard":
        """From SGLang's VocabParallelEmbedding (``weight`` and ``shard_indices``)."""
        weight = getattr(embed, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise LayoutMismatch(
                f"the target embedding {type(embed).__name__} has no weight tensor; the EAGLE-3 "
                f"self-check cannot compare the embed slot. Serve an unquantized embedding."
            )
        idx = getattr(embed, "shard_indices", None)
        if idx is None:  # a plain nn.Embedding: the whole vocabulary
            return cls(weight, 0, int(weight.shape[0]))
        return cls(weight, int(idx.org_vocab_start_index), int(idx.org_vocab_end_index))

    def rows(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask [T] of ids in this shard, their embedding rows [n, H])."""
        ids = input_ids.long()
        mask = (ids >= self.start) & (ids < self.end)  # [T]
        return mask, self.weight[ids[mask] - self.start]  # [n, H]


def self_check(packed: torch.Tensor, input_ids: torch.Tensor, layout: Layout,
               embedding: EmbeddingShard) -> str:
    """Check the packed fc input of one forward; returns the line to log, raises on failure.

    packed: [T, K*H] in layout order; input_ids: [T]. One host sync (the verdict).
    """
    K = len(layout)
    T, width = packed.shape
    if width % K != 0:
        raise LayoutMismatch(f"the fc input is {width} wide, not a multiple of the layout's {K} slots")
    H = width // K
    if input_ids.shape[0] != T:
        raise LayoutMismatch(
            f"the self-check got {input_ids.shape[0]} input ids for {T} captured rows; "
            f"expected one id per row."
        )
    slots = [packed[:, j * H : (j + 1) * H] for j in range(K)]  # K x [T, H]
    checked_embed = 0
    for j, src in enumerate(layout.sources):
        if not src.is_embed:
            continue
        mask, want = embedding.rows(input_ids)
        got = slots[j][mask]
        checked_embed = int(mask.sum())
        if not torch.equal(got, want.to(got.dtype)):
            diff = (got.float() - want.float()).abs().max().item() if got.numel() else float("nan")
            raise LayoutMismatch(
                f"EAGLE-3 self-check failed: fc slot {j} ({src}) of layout {layout} differs from the "
                f"target's embedding of the input ids (max |diff| {diff:.4g} over {checked_embed} "
                f"tokens); expected equal. The target captured another state than the layout "
                f"names: this SGLang build's model file captures differently than eagle3_backend "
                f"expects. Do not serve this draft with it; report the SGLang version."
            )
    for a in range(K):
        for b in range(a + 1, K):
            if T > 0 and torch.equal(slots[a], slots[b]):
                raise LayoutMismatch(
                    f"EAGLE-3 self-check failed: fc slots {a} ({layout.sources[a]}) and {b} "
                    f"({layout.sources[b]}) of layout {layout} are identical over {T} tokens; "
                    f"expected distinct hidden states. The target captured one state twice or "
                    f"never wrote a slot. Do not serve this draft with this SGLang build."
                )
    logger.debug("self-check compared %d embed rows and %d slot pairs over %d tokens",
                 checked_embed, K * (K - 1) // 2, T)
    shard = ""
    if layout.has_embed:  # under tensor parallel each rank holds (and checks) its vocabulary shard
        shard = (f"; embed slot on this rank's vocabulary shard [{embedding.start}, {embedding.end}): "
                 f"{checked_embed} of {T} tokens")
    return f"EAGLE-3 layout {layout} -> fc input {width} (checked){shard}"
