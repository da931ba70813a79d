"""Draft token trees: the speculative settings and EAGLE's top-k tree drafting.

Settings use SGLang's names. With ``speculative_eagle_topk == 1`` the tree is a
chain of ``speculative_num_steps`` tokens (``num_draft_tokens = steps + 1``).
With top-k > 1, as SGLang's EAGLE does:

1. the draft's distribution after the root gives the top-k first-level nodes,
   scored by their log-probability;
2. each further step runs the draft once on the k *frontier* nodes (tree
   attention: a node sees the committed prefix, its ancestors and itself),
   expands each by its top-k, scores every child by the cumulative
   log-probability of its path, and keeps the best k of the k*k as the next
   frontier;
3. of every node scored on the way, the best ``num_draft_tokens - 1`` by
   cumulative log-probability form the tree that the target verifies in one
   forward. A child never outscores its parent (log-probs are <= 0) and ties
   break by creation order, so the kept set always contains every kept node's
   ancestors.

Draft positions: draft position ``i`` pairs the token at sequence position
``i + 1`` with the hidden state at ``i``, so a node at depth ``d`` below a
root at position ``P`` is fed to the draft at ``P + d - 1`` and verified by
the target at ``P + d``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.model import DraftKVCache, Eagle3DraftModel, tree_attention_mask

__all__ = ["DraftTree", "SpecSettings", "draft_tree", "max_draft_tokens"]


def max_draft_tokens(steps: int, topk: int) -> int:
    """The most tokens one verify step can hold: the root plus every node the draft scores
    (k at the first step, k*k at each later one). SGLang keeps the best
    ``num_draft_tokens - 1`` of those nodes and cannot keep more than exist."""
    return 1 + topk + (steps - 1) * topk * topk


def _pos_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Eagle3Error(f"{name} must be an integer >= 1, got {value!r}.")


@dataclass(frozen=True, slots=True)
class SpecSettings:
    """SGLang's speculative settings; ``speculative_num_draft_tokens=None`` picks
    ``steps + 1`` for a chain and the largest useful tree for top-k > 1 capped at 8."""

    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        _pos_int("speculative_num_steps", self.speculative_num_steps)
        _pos_int("speculative_eagle_topk", self.speculative_eagle_topk)
        steps, k = self.speculative_num_steps, self.speculative_eagle_topk
        most = max_draft_tokens(steps, k)
        n = self.speculative_num_draft_tokens
        if n is None:
            n = steps + 1 if k == 1 else min(most, 8)
            object.__setattr__(self, "speculative_num_draft_tokens", n)
        _pos_int("speculative_num_draft_tokens", n)
        if k == 1 and n != steps + 1:
            raise Eagle3Error(
                f"speculative_num_draft_tokens={n} with speculative_eagle_topk=1: a chain of "
                f"{steps} steps verifies exactly {steps + 1} tokens (root + {steps} drafts). "
                f"Set speculative_num_draft_tokens={steps + 1}, or raise the top-k for a tree."
            )
        if not 2 <= n <= most:
            raise Eagle3Error(
                f"speculative_num_draft_tokens={n} is out of range for {steps} steps with "
                f"top-k {k}: expected 2..{most} (root + at most k + (steps-1)*k*k drafted "
                "nodes). " + ("Raise it to at least 2 (the root and one draft token)." if n < 2 else
                              "Lower it or raise speculative_num_steps / speculative_eagle_topk.")
            )

    @property
    def is_chain(self) -> bool:
        return self.speculative_eagle_topk == 1

    def to_dict(self) -> dict[str, int]:
        return {
            "speculative_num_steps": self.speculative_num_steps,
            "speculative_eagle_topk": self.speculative_eagle_topk,
            "speculative_num_draft_tokens": int(self.speculative_num_draft_tokens),
        }


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A verify tree: node 0 is the root (last committed token), parents listed first.

    ``tokens`` [N] int64 target-vocab ids; ``parents[i]`` < i (-1 for the root);
    ``depths[i]`` = distance from the root; children are linked in sibling order
    (best score first) by ``first_child`` / ``next_sibling`` (-1 = none); ``scores``
    are the drafted nodes' cumulative log-probabilities.
    """

    tokens: torch.Tensor
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    first_child: tuple[int, ...]
    next_sibling: tuple[int, ...]
    scores: torch.Tensor | None = None  # [N] cumulative draft log-prob (root 0), if drafted

    @classmethod
    def from_parents(cls, tokens: torch.Tensor, parents: list[int],
                     scores: torch.Tensor | None = None) -> "DraftTree":
        n = len(parents)
        if tokens.shape != (n,) or parents[0] != -1:
            raise Eagle3Error(
                f"a draft tree needs one token per node and node 0 as root, got tokens "
                f"{list(tokens.shape)} and parents {parents[:4]}..."
            )
        depths = [0] * n
        first_child = [-1] * n
        next_sibling = [-1] * n
        last_child = [-1] * n
        for i in range(1, n):
            p = parents[i]
            if not 0 <= p < i:
                raise Eagle3Error(f"tree node {i} has parent {p}; expected 0 <= parent < {i}.")
            depths[i] = depths[p] + 1
            if last_child[p] == -1:
                first_child[p] = i
            else:
                next_sibling[last_child[p]] = i
            last_child[p] = i
        return cls(tokens, tuple(parents), tuple(depths), tuple(first_child), tuple(next_sibling),
                   scores)

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def attention_mask(self, prefix_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """bool [N, prefix_len + N]: a node sees the prefix, its ancestors and itself."""
        return tree_attention_mask(list(self.parents), prefix_len, device)

    def path(self, node: int) -> list[int]:
        """Nodes from the root to ``node`` inclusive."""
        out = []
        while node != -1:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


@torch.no_grad()
def draft_tree(
    model: Eagle3DraftModel,
    settings: SpecSettings,
    root_token: int,
    ext_ids: torch.Tensor,
    ext_hidden: torch.Tensor,
    cache: DraftKVCache,
) -> DraftTree:
    """Extend the draft with the newly committed tokens, then draft a verify tree.

    ext_ids [1, T]: the tokens committed since the last call (target vocab; the
    last one is ``root_token``); ext_hidden [1, T, K*Ht]: the target states at the
    positions just before each of them (layout order). ``cache`` holds the draft
    K/V of every earlier committed position and is left holding the extended
    prefix only (the drafted nodes' K/V are dropped).
    """
    k = settings.speculative_eagle_topk
    steps = settings.speculative_num_steps
    if k > model.config.draft_vocab_size:
        raise Eagle3Error(
            f"speculative_eagle_topk={k} exceeds the draft vocabulary "
            f"({model.config.draft_vocab_size} tokens). Lower the top-k."
        )
    device = ext_ids.device
    T = ext_ids.shape[1]
    start = cache.length
    positions = (start + torch.arange(T, device=device))[None]       # [1, T]
    logits, hidden = model(ext_ids, ext_hidden, positions, cache, projected=False,
                           last_logits=True)
    prefix = cache.length                                             # == root position

    # pool of scored nodes: target token, parent pool index (-1 = root), score
    logp = torch.log_softmax(logits[0, -1].float(), dim=-1)          # [Vd]
    top = logp.topk(k)
    pool_tok = [model.draft_to_target(top.indices)]                   # chunks of [k] / [k*k]
    pool_score = [top.values]
    pool_parent = [torch.full((k,), -1, dtype=torch.long, device=device)]
    frontier = torch.arange(k, device=device)                         # pool indices [k]
    frontier_score = top.values                                       # [k]
    frontier_hidden = hidden[:, -1:].expand(1, k, hidden.shape[-1])   # [1, k, H]
    frontier_tok = pool_tok[0]
    cache_parent: list[int] = []                                      # per fed node, cache-local
    fed_pool: dict[int, int] = {}                                     # pool idx -> cache-local idx
    pool_size = k
    prev_parent_pool = [-1] * k
    for step in range(1, steps):
        local_parents = [fed_pool.get(p, -1) for p in prev_parent_pool]
        base = len(cache_parent)
        for j, pool_idx in enumerate(frontier.tolist()):
            fed_pool[pool_idx] = base + j
        cache_parent.extend(local_parents)
        mask = tree_attention_mask(cache_parent, prefix, device)[base:]  # [k, prefix + n_fed]
        pos = torch.full((1, k), prefix + step - 1, dtype=torch.long, device=device)
        logits, out_hidden = model(frontier_tok[None], frontier_hidden, pos, cache,
                                   attn_mask=mask[None], projected=True)
        logp = torch.log_softmax(logits[0].float(), dim=-1)          # [k, Vd]
        top = logp.topk(k, dim=-1)                                    # [k, k]
        scores = (frontier_score[:, None] + top.values).reshape(-1)   # [k*k]
        toks = model.draft_to_target(top.indices).reshape(-1)         # [k*k]
        parents = frontier.repeat_interleave(k)                       # [k*k] pool idx
        pool_tok.append(toks)
        pool_score.append(scores)
        pool_parent.append(parents)
        keep = _best(scores, k)                                       # [k] indices into k*k
        frontier = pool_size + keep
        frontier_score = scores[keep]
        frontier_tok = toks[keep]
        frontier_hidden = out_hidden[:, keep // k]                   # [1, k, H]
        prev_parent_pool = parents[keep].tolist()
        pool_size += k * k
    cache.crop(prefix)

    all_tok = torch.cat(pool_tok)                                     # [P]
    all_score = torch.cat(pool_score)
    all_parent = torch.cat(pool_parent).tolist()
    chosen = sorted(_best(all_score, settings.speculative_num_draft_tokens - 1).tolist())
    where = {p: i + 1 for i, p in enumerate(chosen)}                  # pool idx -> tree node
    parents = [-1] + [0 if all_parent[p] == -1 else where[all_parent[p]] for p in chosen]
    tokens = torch.cat([torch.tensor([root_token], device=device), all_tok[chosen]])
    scores = torch.cat([torch.zeros(1, device=device), all_score[chosen]])
    return DraftTree.from_parents(tokens.long(), parents, scores)


def _best(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n highest scores, ties to the lower index (stable)."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:n]
