"""Architecture of an EAGLE-3 draft model: one frozen, validated config.

Field names follow the HF / SGLang ``config.json`` keys of EAGLE-3 drafts
(``hidden_size``, ``draft_vocab_size``, ``target_hidden_size``, ...) so the
checkpoint code can map them one to one. Two fields are this project's own:
``layout`` (the canonical hidden-state layout, see :mod:`eagle3_backend.layout`)
and ``has_embed_tokens`` (whether the draft carries its own token embedding or
borrows the target's, as SpecForge exports do).

Variants found in published checkpoints, and what each flag means in
:class:`eagle3_backend.model.Eagle3DraftModel`:

===================== ======================================================
``fc_bias``           fc has a bias (SGLang config key ``bias``)
``norm_before_fc``    one RMSNorm over the whole K*Ht fc input (``input_norm``)
``fc_norm``           one RMSNorm per layout slot, on each Ht chunk (``fc_norm.i``)
``norm_before_residual`` the residual carried past attention is the *normed*
                      fc output (``hidden_norm(h)``), not ``h`` itself
``norm_output``       the hidden fed to the next draft step is the final-normed
                      one (the one the lm_head sees), not the pre-norm stream
``rope_scaling``      None or llama3 frequency scaling (:class:`RopeScaling`)
``tie_word_embeddings`` lm_head is the embedding (needs draft vocab == vocab)
===================== ======================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout

__all__ = ["DTYPES", "DraftConfig", "RopeScaling"]

#: dtype names a draft may be built in, mapped to torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise Eagle3Error(f"DraftConfig.{name} must be a positive integer, got {value!r}.")


def _positive_float(name: str, value: Any) -> None:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise Eagle3Error(f"DraftConfig.{name} must be a finite number > 0, got {value!r}.")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3 rotary frequency scaling (HF ``rope_scaling`` with ``rope_type: llama3``).

    Wavelengths longer than ``original_max_position_embeddings / low_freq_factor``
    are divided by ``factor``, shorter than ``... / high_freq_factor`` are kept,
    and the band between is interpolated smoothly.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise Eagle3Error(
                f"rope_scaling type {self.rope_type!r} is not supported; expected 'llama3' "
                "or no scaling. Drafts with other scaling types cannot be run by this backend."
            )
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise Eagle3Error(f"rope_scaling.{name} must be a number > 0, got {v!r}.")
            object.__setattr__(self, name, float(v))
        if self.high_freq_factor < self.low_freq_factor:
            raise Eagle3Error(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) is below "
                f"low_freq_factor ({self.low_freq_factor}); llama3 scaling needs "
                "high >= low (Llama 3.1 uses low 1.0, high 4.0). Check the draft's config.json."
            )
        _positive_int("rope_scaling.original_max_position_embeddings",
                      self.original_max_position_embeddings)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "RopeScaling | None":
        """From a HF ``rope_scaling`` dict; None or type 'default' means no scaling."""
        if d is None:
            return None
        if not isinstance(d, Mapping):
            raise Eagle3Error(f"rope_scaling must be a dict or null, got {d!r}.")
        kind = d.get("rope_type", d.get("type", "default"))
        if kind == "default":
            return None
        if kind != "llama3":
            raise Eagle3Error(
                f"rope_scaling type {kind!r} is not supported; expected 'llama3' or no "
                "scaling. Drafts with other scaling types cannot be run by this backend."
            )
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor",
                               "original_max_position_embeddings") if k not in d]
        if missing:
            raise Eagle3Error(
                f"rope_scaling {dict(d)!r} is of type llama3 but lacks {missing}; "
                "llama3 scaling needs factor, low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings."
            )
        return cls(
            factor=d["factor"],
            low_freq_factor=d["low_freq_factor"],
            high_freq_factor=d["high_freq_factor"],
            original_max_position_embeddings=d["original_max_position_embeddings"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rope_type": self.rope_type,
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }


@dataclass(frozen=True, slots=True)
class DraftConfig:
    """EAGLE-3 draft architecture (one decoder layer, Llama-style).

    ``vocab_size`` is the *target* vocabulary (embedding rows, ``t2d`` length);
    ``draft_vocab_size`` is the lm_head's output size (``d2t`` length).
    ``head_dim=None`` resolves to ``hidden_size // num_attention_heads``.
    ``layout`` may be given as a :class:`Layout`, a string or a list of strings.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    layout: Layout
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    attention_bias: bool = False
    fc_bias: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_before_residual: bool = False
    norm_output: bool = False
    tie_word_embeddings: bool = False
    has_embed_tokens: bool = True
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "draft_vocab_size",
                     "target_hidden_size", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        _positive_float("rms_norm_eps", self.rms_norm_eps)
        _positive_float("rope_theta", self.rope_theta)
        for name in ("attention_bias", "fc_bias", "norm_before_fc", "fc_norm",
                     "norm_before_residual", "norm_output", "tie_word_embeddings",
                     "has_embed_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise Eagle3Error(
                    f"DraftConfig.{name} must be True or False, got {getattr(self, name)!r}."
                )

        object.__setattr__(self, "layout", Layout.parse(self.layout))
        if isinstance(self.rope_scaling, Mapping) or self.rope_scaling is None:
            object.__setattr__(self, "rope_scaling", RopeScaling.from_dict(self.rope_scaling))
        elif not isinstance(self.rope_scaling, RopeScaling):
            raise Eagle3Error(
                f"DraftConfig.rope_scaling must be None, a RopeScaling or a HF rope_scaling "
                f"dict, got {self.rope_scaling!r}."
            )

        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if heads % kv != 0:
            raise Eagle3Error(
                f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                f"({kv}); grouped-query attention needs each kv head shared by the same "
                "number of query heads. Check the draft's config.json."
            )
        if self.head_dim is None:
            if self.hidden_size % heads != 0:
                raise Eagle3Error(
                    f"head_dim is not set and hidden_size {self.hidden_size} is not divisible "
                    f"by num_attention_heads {heads}; set head_dim explicitly."
                )
            object.__setattr__(self, "head_dim", self.hidden_size // heads)
        _positive_int("head_dim", self.head_dim)
        if self.head_dim % 2 != 0:
            raise Eagle3Error(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}."
            )

        if self.draft_vocab_size > self.vocab_size:
            raise Eagle3Error(
                f"draft_vocab_size {self.draft_vocab_size} exceeds the target vocab_size "
                f"{self.vocab_size}; the draft vocabulary is a subset of the target's. "
                "Check that vocab_size is the target's vocabulary, not the draft's."
            )
        if self.hidden_act != "silu":
            raise Eagle3Error(
                f"hidden_act {self.hidden_act!r} is not supported; EAGLE-3 drafts use 'silu'."
            )
        if self.dtype not in DTYPES:
            raise Eagle3Error(
                f"DraftConfig.dtype {self.dtype!r} is not supported; expected one of "
                f"{sorted(DTYPES)}."
            )
        if self.tie_word_embeddings and self.draft_vocab_size != self.vocab_size:
            raise Eagle3Error(
                f"tie_word_embeddings needs draft_vocab_size == vocab_size, got "
                f"{self.draft_vocab_size} vs {self.vocab_size}: SGLang uses the full "
                "embedding as lm_head, which cannot produce draft-vocabulary logits. "
                "Untie the lm_head (tie_word_embeddings=false) or use the full vocabulary."
            )
        if not self.has_embed_tokens and self.target_hidden_size != self.hidden_size:
            raise Eagle3Error(
                f"the draft takes the target's embedding (has_embed_tokens=False) but its "
                f"hidden_size {self.hidden_size} differs from target_hidden_size "
                f"{self.target_hidden_size}; SGLang only shares the embedding when the two "
                "are equal. Ship the draft's own embed_tokens.weight."
            )

    # ------------------------------------------------------------ derived sizes
    @property
    def fc_in_features(self) -> int:
        """Width of the fc input: ``len(layout) * target_hidden_size``."""
        return len(self.layout) * self.target_hidden_size

    @property
    def num_aux_hidden_states(self) -> int:
        """Number of target hidden states in the fc input (SGLang's name for K)."""
        return len(self.layout)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def uses_vocab_map(self) -> bool:
        """True when the draft vocabulary is a strict subset (d2t is non-trivial)."""
        return self.draft_vocab_size != self.vocab_size
