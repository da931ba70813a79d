"""Speculative rejection sampling that preserves the target distribution.

Two forms, both exact (the committed tokens are distributed as if sampled
from the target one at a time):

* :func:`chain_speculative_sampling` - a chain of S draft tokens drawn from
  draft distributions ``q`` (Leviathan et al. / Chen et al.): accept draft
  token ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first
  rejection sample from ``normalize(max(0, p_i - q_i))``; if all S are
  accepted sample a bonus token from ``p_S``. Same contract as
  ``flashinfer.sampling.chain_speculative_sampling`` (which runs it on a GPU:
  :func:`chain_speculative_sampling` dispatches there for CUDA tensors when
  flashinfer is importable; the torch code here is the reference and the CPU
  path).
* :func:`tree_speculative_sampling` - a token tree whose children were chosen
  deterministically (top-k of the draft, as EAGLE does; i.e. ``q`` is one-hot
  per child). Walking a node's children in sibling order, child token ``t`` is
  accepted with probability ``r(t)`` where ``r`` is the target distribution at
  the node with the already rejected siblings removed and renormalized; when
  every child is rejected the next token is sampled from ``r``. Recursive
  rejection sampling with one-hot proposals is exact for any number of
  children.

Temperature is applied by the caller (``probs = softmax(logits / T)``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "chain_speculative_sampling",
    "chain_speculative_sampling_torch",
    "probs_from_logits",
    "sample_from_probs",
    "tree_speculative_sampling",
]


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in fp32: [..., V] -> [..., V]."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}; use greedy for 0.")
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [..., V] -> int64 [...] (inverse-CDF with one uniform)."""
    flat = probs.reshape(-1, probs.shape[-1])  # [N, V]
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)  # [N]
    return out.reshape(probs.shape[:-1])


def _uniform(shape: Sequence[int], generator: torch.Generator | None, device) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=generator, device=device)


def chain_speculative_sampling_torch(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference chain speculative sampling, batched.

    draft_probs [B, S, V], draft_token_ids [B, S], target_probs [B, S+1, V]
    -> (output_ids [B, S+1] int64, -1 after the last emitted token;
        emitted [B] int64 = accepted draft tokens, the bonus/resampled token not counted).
    """
    B, S, V = draft_probs.shape
    if draft_token_ids.shape != (B, S) or target_probs.shape != (B, S + 1, V):
        raise ValueError(
            f"shapes disagree: draft_probs {list(draft_probs.shape)}, draft_token_ids "
            f"{list(draft_token_ids.shape)}, target_probs {list(target_probs.shape)}; expected "
            f"[B, S, V], [B, S], [B, S+1, V]."
        )
    device = target_probs.device
    q_all = draft_probs.float()
    p_all = target_probs.float()
    tok = draft_token_ids.long()
    out = torch.full((B, S + 1), -1, dtype=torch.long, device=device)
    emitted = torch.zeros(B, dtype=torch.long, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)  # still accepting
    u = _uniform((B, S), generator, device)                  # one coin per draft token
    rows = torch.arange(B, device=device)
    for i in range(S):
        t = tok[:, i]                                        # [B]
        p = p_all[rows, i, t]
        q = q_all[rows, i, t]
        accept = alive & (u[:, i] * q < p)                   # u < p/q without dividing by 0
        out[accept, i] = t[accept]
        emitted += accept.long()
        reject = alive & ~accept
        if reject.any():
            resid = (p_all[reject, i] - q_all[reject, i]).clamp_min(0)  # [R, V]
            total = resid.sum(-1, keepdim=True)
            # p == q exactly leaves no residual; then p itself is the right law.
            resid = torch.where(total > 0, resid / total.clamp_min(1e-30), p_all[reject, i])
            out[reject, i] = sample_from_probs(resid, generator)
        alive = accept
    if alive.any():
        out[alive, S] = sample_from_probs(p_all[alive, S], generator)
    return out, emitted


def _flashinfer_chain(draft_probs, draft_token_ids, target_probs, generator):
    from flashinfer.sampling import chain_speculative_sampling as fi_chain

    B = draft_probs.shape[0]
    emitted = torch.zeros(B, dtype=torch.int32, device=draft_probs.device)
    accepted = torch.zeros(B, dtype=torch.int32, device=draft_probs.device)
    out = fi_chain(
        draft_probs.float(), draft_token_ids.int(), target_probs.float(),
        maybe_output_accepted_token_num=accepted,
        maybe_output_emitted_draft_token_num=emitted,
        generator=generator,
    )
    return out.long(), emitted.long()


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain speculative sampling; ``backend`` is "auto", "torch" or "flashinfer".

    "auto" uses flashinfer's fused kernel for CUDA tensors when it imports, else
    the torch reference (same law; the random streams differ).
    """
    if backend not in ("auto", "torch", "flashinfer"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'flashinfer', got {backend!r}.")
    if backend == "torch" or (backend == "auto" and target_probs.device.type != "cuda"):
        return chain_speculative_sampling_torch(draft_probs, draft_token_ids, target_probs, generator)
    try:
        return _flashinfer_chain(draft_probs, draft_token_ids, target_probs, generator)
    except (ImportError, RuntimeError) as exc:
        if backend == "flashinfer":
            raise
        logger.warning("flashinfer chain_speculative_sampling unavailable (%s); using torch", exc)
        return chain_speculative_sampling_torch(draft_probs, draft_token_ids, target_probs, generator)


def tree_speculative_sampling(
    target_probs: torch.Tensor,
    candidates: Sequence[int],
    first_child: Sequence[int],
    next_sibling: Sequence[int],
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """Rejection sampling over one request's draft tree with one-hot proposals.

    target_probs [D, V]: the target distribution after each node (node 0 = the
    root, the last committed token); candidates[i] is node i's draft token;
    first_child / next_sibling link the tree (-1 = none). Returns (accepted node
    indices starting with the root, the token sampled after the last of them).
    """
    probs = target_probs.float()
    device = probs.device
    accepted = [0]
    node = 0
    while True:
        r = probs[node].clone()                 # [V] residual at this node
        child = first_child[node]
        chosen = -1
        while child != -1:
            t = int(candidates[child])
            mass = r.sum()
            p_t = r[t] / mass if mass > 0 else torch.zeros((), device=device)
            if float(_uniform((), generator, device)) < float(p_t):
                chosen = child
                break
            r[t] = 0.0                           # reject: remove t, renormalize later
            child = next_sibling[child]
        if chosen == -1:
            if r.sum() <= 0:                     # every token was a rejected sibling
                r = probs[node]
            return accepted, int(sample_from_probs(r / r.sum(), generator))
        accepted.append(chosen)
        node = chosen
