"""config.json fields -> :class:`DraftConfig`, for the SGLang, speculators and EAGLE-repo formats.

The three formats share the HF Llama field names (``hidden_size``,
``intermediate_size``, ...); they differ in where those live (top level vs
speculators' ``transformer_layer_config``) and in the EAGLE-3 flags. Every
value is type-checked and a bad one is reported with the file, the field, the
value and what was expected.
"""

from __future__ import annotations

from typing import Any, Mapping

from eagle3_backend.config import DTYPE_ALIASES, DTYPES, DraftConfig
from eagle3_backend.errors import CheckpointError, Eagle3Error
from eagle3_backend.layout import Layout


class Fields:
    """Typed access to one JSON object, naming the file and key in every error."""

    def __init__(self, raw: Mapping[str, Any], where: str, prefix: str = ""):
        self.raw, self.where, self.prefix = raw, where, prefix

    def _bad(self, key: str, value: Any, expected: str) -> CheckpointError:
        return CheckpointError(
            f"{self.where}: field {self.prefix}{key!r} is {value!r}; expected {expected}. "
            f"Fix config.json (compare with the config the draft was trained with)."
        )

    def int(self, key: str, default: Any = ..., positive: bool = True) -> Any:
        value = self.raw.get(key, None)
        if value is None:
            if default is ...:
                raise CheckpointError(
                    f"{self.where}: required field {self.prefix}{key!r} is missing; expected a "
                    f"positive integer. Add it to config.json (copy it from the training config)."
                )
            return default
        if isinstance(value, bool) or not isinstance(value, int) or (positive and value <= 0):
            raise self._bad(key, value, "a positive integer" if positive else "an integer")
        return value

    def float(self, key: str, default: Any) -> Any:
        value = self.raw.get(key, None)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, value, "a number")
        return float(value)

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.raw.get(key, None)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def str(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key, None)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def dict(self, key: str) -> dict[str, Any] | None:
        value = self.raw.get(key, None)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self._bad(key, value, "a JSON object")
        return dict(value)

    def int_list(self, key: str) -> list[int] | None:
        value = self.raw.get(key, None)
        if value is None:
            return None
        if (not isinstance(value, list) or not value
                or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
            raise self._bad(key, value, "a non-empty list of integers (layer ids)")
        return list(value)

    def str_list(self, key: str) -> list[str] | None:
        value = self.raw.get(key, None)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, value, "a list of strings")
        return list(value)


def config_dtype(raw: Mapping[str, Any], where: str) -> tuple[str | None, list[str]]:
    """The dtype config.json declares (``torch_dtype`` or ``dtype``), and notes."""
    notes: list[str] = []
    found = {k: raw[k] for k in ("torch_dtype", "dtype") if raw.get(k) is not None}
    names = {}
    for key, value in found.items():
        name = str(value).removeprefix("torch.")
        names[key] = DTYPE_ALIASES.get(name, name)
    if len(set(names.values())) > 1:
        notes.append(f"{where}: config says torch_dtype {found['torch_dtype']!r} but dtype "
                     f"{found['dtype']!r}; the tensors' own dtype is used")
    value = names.get("torch_dtype", names.get("dtype"))
    return value, notes


def rope_fields(f: Fields) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling dict or None) from legacy keys or transformers-5 rope_parameters."""
    theta = f.float("rope_theta", None)
    scaling = f.dict("rope_scaling")
    params = f.dict("rope_parameters")
    if params is not None:
        if theta is None and isinstance(params.get("rope_theta"), (int, float)):
            theta = float(params["rope_theta"])
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    top_omax = f.int("original_max_position_embeddings", None)
    if top_omax is not None and scaling is not None and scaling.get(
            "rope_type", scaling.get("type")) == "yarn":
        # SGLang and transformers both let a top-level value override the dict's.
        inner = scaling.get("original_max_position_embeddings")
        if inner is not None and inner != top_omax:
            raise CheckpointError(
                f"{f.where}: field {f.prefix}'original_max_position_embeddings' is {top_omax} "
                f"but rope_scaling's is {inner!r}; SGLang and transformers use the top-level "
                f"one. Make them equal (the value the target was pre-trained with)."
            )
        scaling = {**scaling, "original_max_position_embeddings": top_omax}
    return (theta if theta is not None else 10000.0), scaling


def build_draft_config(
    *,
    arch: Fields,
    flags: Fields,
    eagle_config: Mapping[str, Any] | None,
    layout: Layout,
    has_embed_tokens: bool,
    dtype: str,
    where: str,
) -> DraftConfig:
    """DraftConfig from the Llama-style fields (``arch``) and EAGLE-3 flags (``flags``)."""
    layers = arch.int("num_hidden_layers", 1)
    if arch.bool("mlp_bias", False):
        raise CheckpointError(
            f"{where}: field {arch.prefix}'mlp_bias' is true; expected false (EAGLE-3 drafts "
            f"have no MLP bias and this backend does not implement one)."
        )
    hidden = arch.int("hidden_size")
    vocab = arch.int("vocab_size")
    theta, scaling = rope_fields(arch)
    eagle = Fields(eagle_config or {}, where, "eagle_config.")
    norm_before_fc = eagle.bool("norm_before_fc", flags.bool("norm_before_fc", False))
    fc_norm = flags.bool("fc_norm", False) or flags.bool("use_aux_norm", False)
    num_aux = flags.int("num_aux_hidden_states", None)
    if num_aux is not None and num_aux != len(layout):
        raise CheckpointError(
            f"{where}: field 'num_aux_hidden_states' is {num_aux}, but the layout {layout} has "
            f"{len(layout)} sources; expected them equal (SGLang sizes fc from "
            f"num_aux_hidden_states). Fix one of the two."
        )
    try:
        return DraftConfig(
            hidden_size=hidden,
            intermediate_size=arch.int("intermediate_size"),
            num_attention_heads=arch.int("num_attention_heads"),
            num_key_value_heads=arch.int("num_key_value_heads", arch.int("num_attention_heads")),
            vocab_size=vocab,
            draft_vocab_size=flags.int("draft_vocab_size", None) or vocab,
            target_hidden_size=flags.int("target_hidden_size", None) or hidden,
            layout=layout,
            head_dim=arch.int("head_dim", None),
            rms_norm_eps=arch.float("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=arch.int("max_position_embeddings", 2048),
            hidden_act=arch.str("hidden_act", "silu"),
            attention_bias=arch.bool("attention_bias", False),
            fc_bias=flags.bool("bias", False),
            norm_before_fc=norm_before_fc,
            fc_norm=fc_norm,
            norm_before_residual=flags.bool("norm_before_residual", False),
            norm_output=flags.bool("norm_output", False),
            tie_word_embeddings=arch.bool("tie_word_embeddings", False),
            has_embed_tokens=has_embed_tokens,
            dtype=dtype,
            num_hidden_layers=layers,
        )
    except CheckpointError:
        raise
    except Eagle3Error as exc:
        raise CheckpointError(f"{where}: {exc}") from None


def tensor_dtype(tensors: Mapping[str, Any], where: str) -> tuple[str, list[str]]:
    """The dtype of the draft's weights (fc.weight's, else the most common float dtype)."""
    notes: list[str] = []
    floats = {n: t.dtype for n, t in tensors.items() if t.is_floating_point()}
    if not floats:
        raise CheckpointError(f"{where}: holds no floating-point weights; expected a draft's "
                              f"state dict. Check that the right file was exported.")
    counts: dict[Any, int] = {}
    for d in floats.values():
        counts[d] = counts.get(d, 0) + 1
    main = floats.get("fc.weight") or max(counts, key=counts.get)
    if len(counts) > 1:
        others = sorted(n for n, d in floats.items() if d != main)
        notes.append(f"{where}: weights mix dtypes: {others} are not {main}; they are kept as "
                     f"stored")
    name = str(main).removeprefix("torch.")
    if name not in DTYPES:
        raise CheckpointError(
            f"{where}: weights are {name}; expected one of {sorted(DTYPES)}. Dequantize or cast "
            f"the draft to bfloat16 before loading it."
        )
    return name, notes
