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
``rope_scaling``      None, llama3 or yarn frequency scaling (:class:`RopeScaling`)
``tie_word_embeddings`` lm_head is the embedding (needs draft vocab == vocab)
===================== ======================================================
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout

__all__ = ["DTYPES", "DTYPE_ALIASES", "DraftConfig", "RopeScaling"]

logger = logging.getLogger(__name__)

#: dtype names a draft may be built in, mapped to torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
#: Other names for them: short ones and torch's own (``torch.half``), as config.json files
#: and ``verify.targets.parse_dtype`` take them.
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "float": "float32"}


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


#: rope_scaling types this backend runs, and the keys each accepts (besides rope_type / type).
_ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
             "attention_factor", "mscale", "mscale_all_dim"),
}


def _unsupported_type(kind: Any) -> Eagle3Error:
    if kind == "dynamic":
        return Eagle3Error(
            "rope_scaling type 'dynamic' is not supported: SGLang 0.5.23 rotates every "
            "position with the NTK base for max_position_embeddings x factor, while "
            "transformers (where drafts are trained) keeps the plain base up to "
            "max_position_embeddings, so such a draft is served other rotations than it was "
            "trained with. Retrain it with no scaling, 'linear', 'llama3' or 'yarn'."
        )
    return Eagle3Error(
        f"rope_scaling type {kind!r} is not supported; expected 'linear', 'llama3', 'yarn' "
        "or no scaling. Drafts with other scaling types cannot be run by this backend."
    )


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary frequency scaling (HF ``rope_scaling``): ``linear``, ``llama3`` or ``yarn``.

    linear (``rope_type: linear``): every frequency divided by ``factor`` (positions
    interpolated), as transformers and SGLang 0.5.23 both do.

    llama3 (``rope_type: llama3``): wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``,
    shorter than ``... / high_freq_factor`` are kept, and the band between is
    interpolated smoothly.

    yarn (``rope_type: yarn``, gpt-oss and DeepSeek-style drafts): dimensions that turn
    more than ``beta_fast`` times over ``original_max_position_embeddings`` positions
    keep their frequency, fewer than ``beta_slow`` times are divided by ``factor``, with
    a linear ramp between (its ends rounded outwards when ``truncate``); cos and sin
    are then multiplied by :attr:`attention_scale`. A yarn dict without
    ``original_max_position_embeddings`` takes the config's ``max_position_embeddings``
    (as HF and SGLang do; see :meth:`from_dict`).

    ``attention_scale`` follows SGLang 0.5.23 (what serves the draft), which differs
    from transformers in one case: SGLang ignores an explicit ``attention_factor``
    and always derives the scale from ``factor`` (and ``mscale`` / ``mscale_all_dim``
    when both are set); a differing ``attention_factor`` is kept in the config and
    logged, not applied.
    """

    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    rope_type: str = "llama3"
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in _ROPE_KEYS:
            raise _unsupported_type(self.rope_type)
        others = [k for keys in _ROPE_KEYS.values() for k in keys
                  if k not in _ROPE_KEYS[self.rope_type] and getattr(self, k) is not None]
        if others:
            users = sorted(t for t, keys in _ROPE_KEYS.items() if set(others) & set(keys))
            raise Eagle3Error(
                f"rope_scaling of type {self.rope_type} sets {sorted(set(others))}, which only "
                f"{' and '.join(users)} scaling uses. Remove them or set rope_type to the "
                "scaling the draft was trained with."
            )
        if self.rope_type != "linear":
            _positive_int("rope_scaling.original_max_position_embeddings",
                          self.original_max_position_embeddings)
        if self.rope_type == "llama3":
            self._check_llama3()
        elif self.rope_type == "yarn":
            self._check_yarn()
        else:  # linear; factor >= 1 as transformers expects
            self._number("factor", 1.0, inclusive=True)

    def _number(self, name: str, minimum: float = 0.0, inclusive: bool = False) -> None:
        v = getattr(self, name)
        ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
              and (v >= minimum if inclusive else v > minimum))
        if not ok:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise Eagle3Error(
                f"rope_scaling.{name} must be a number {bound} for {self.rope_type} scaling, "
                f"got {v!r}. Check the draft's config.json."
            )
        object.__setattr__(self, name, float(v))

    def _check_llama3(self) -> None:
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            self._number(name)
        if self.high_freq_factor < self.low_freq_factor:
            raise Eagle3Error(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) is below "
                f"low_freq_factor ({self.low_freq_factor}); llama3 scaling needs "
                "high >= low (Llama 3.1 uses low 1.0, high 4.0). Check the draft's config.json."
            )

    def _check_yarn(self) -> None:
        for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0), ("truncate", True)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        # factor >= 1 as transformers expects; beta_* > 0 as SGLang divides by them.
        self._number("factor", 1.0, inclusive=True)
        self._number("beta_fast")
        self._number("beta_slow")
        if self.beta_fast < self.beta_slow:
            raise Eagle3Error(
                f"rope_scaling.beta_fast ({self.beta_fast}) is below beta_slow "
                f"({self.beta_slow}); yarn needs fast >= slow (gpt-oss and the YaRN paper "
                "use 32 and 1). Check the draft's config.json."
            )
        if not isinstance(self.truncate, bool):
            raise Eagle3Error(
                f"rope_scaling.truncate must be true or false, got {self.truncate!r}."
            )
        # > 0: transformers treats 0 as "not set" and SGLang does not, so 0 is ambiguous.
        for name in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                self._number(name)
        if self.attention_factor is not None and not math.isclose(
                self.attention_factor, self.attention_scale, rel_tol=1e-12):
            logger.warning(
                "rope_scaling.attention_factor %r is not applied: SGLang 0.5.23 ignores it and "
                "scales cos/sin by %r (derived from factor%s), so this backend does too; "
                "transformers would use %r.", self.attention_factor, self.attention_scale,
                ", mscale, mscale_all_dim" if self._uses_mscale_ratio else "",
                self.attention_factor)

    @property
    def _uses_mscale_ratio(self) -> bool:
        return self.mscale is not None and self.mscale_all_dim is not None

    @property
    def attention_scale(self) -> float:
        """The factor SGLang 0.5.23 multiplies cos and sin by (1.0 for llama3).

        yarn: ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are
        set, else ``0.1 * ln(factor) + 1``; ``attention_factor`` is not used (see class doc).
        """
        if self.rope_type != "yarn":
            return 1.0
        if self._uses_mscale_ratio:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor,
                                                                        self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None,
                  max_position_embeddings: int | None = None) -> "RopeScaling | None":
        """From a HF ``rope_scaling`` dict; None or type 'default' means no scaling.

        ``max_position_embeddings`` (the config's) stands in for a yarn dict's missing
        ``original_max_position_embeddings``, as in transformers and SGLang.
        """
        if d is None:
            return None
        if not isinstance(d, Mapping):
            raise Eagle3Error(f"rope_scaling must be a dict or null, got {d!r}.")
        kind = d.get("rope_type", d.get("type", "default"))
        if "rope_type" in d and "type" in d and d["type"] != d["rope_type"]:
            raise Eagle3Error(
                f"rope_scaling {dict(d)!r} says rope_type {d['rope_type']!r} but type "
                f"{d['type']!r}; expected one scaling type. Remove the wrong key."
            )
        if kind == "default":
            return None
        if not isinstance(kind, str) or kind not in _ROPE_KEYS:
            raise _unsupported_type(kind)
        known = _ROPE_KEYS[kind]
        unknown = sorted(k for k in d if k not in known and k not in ("rope_type", "type"))
        if unknown and kind == "yarn":  # llama3 and linear: other keys ignored, as by HF
            raise Eagle3Error(
                f"rope_scaling {dict(d)!r} of type yarn has keys {unknown} this backend does "
                f"not implement; expected only {list(known)} (transformers' yarn keys). "
                "Remove them if the draft was trained without them."
            )
        # null means "use the default" only where HF and SGLang agree on it (mscale,
        # mscale_all_dim, attention_factor); SGLang reads a null truncate as false and
        # fails on a null beta, HF defaults them, so a null there is refused.
        nulls = [k for k in ("factor", "beta_fast", "beta_slow", "truncate")
                 if k in d and d[k] is None]
        if nulls and kind == "yarn":
            raise Eagle3Error(
                f"rope_scaling {dict(d)!r} of type yarn sets {nulls} to null; transformers and "
                "SGLang read a null there differently. Give a value or remove the key."
            )
        args = {k: d[k] for k in known if d.get(k) is not None}
        if kind == "yarn" and "original_max_position_embeddings" not in args:
            if max_position_embeddings is not None:
                args["original_max_position_embeddings"] = max_position_embeddings
        required = ("factor", "original_max_position_embeddings") if kind == "yarn" else known
        missing = [k for k in required if k not in args]
        if missing:
            needs = {"linear": "factor",
                     "llama3": "factor, low_freq_factor, high_freq_factor and "
                               "original_max_position_embeddings",
                     "yarn": "factor and original_max_position_embeddings (or the config's "
                             "max_position_embeddings)"}[kind]
            raise Eagle3Error(
                f"rope_scaling {dict(d)!r} is of type {kind} but lacks {missing}; "
                f"{kind} scaling needs {needs}."
            )
        return cls(rope_type=kind, **args)

    def to_dict(self) -> dict[str, Any]:
        """The HF ``rope_scaling`` dict; unset optional yarn keys are left out."""
        out: dict[str, Any] = {"rope_type": self.rope_type}
        for k in _ROPE_KEYS[self.rope_type]:
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


@dataclass(frozen=True, slots=True)
class DraftConfig:
    """EAGLE-3 draft architecture (Llama-style decoder layers; usually one).

    ``num_hidden_layers`` > 1 stacks plain layers after the first as SGLang 0.5.23 runs
    them (see :mod:`eagle3_backend.model`).

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
    num_hidden_layers: int = 1

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "draft_vocab_size",
                     "target_hidden_size", "max_position_embeddings", "num_hidden_layers"):
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
            object.__setattr__(self, "rope_scaling", RopeScaling.from_dict(
                self.rope_scaling, max_position_embeddings=self.max_position_embeddings))
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
