"""Offline target model: load a Hugging Face target and capture a layout's hidden states.

A target is a transformers causal LM read from a model directory or a GGUF
file (transformers dequantizes GGUF on load; the bundled SmolLM2-135M-Instruct
is one). :class:`HiddenCapture` records, during any forward, exactly the
hidden states a :class:`~eagle3_backend.layout.Layout` names:

* ``embed`` / ``layer_input:K`` (K < num_layers): the input of decoder layer K,
  taken with a forward *pre*-hook on that layer (equal to HF
  ``hidden_states[K]``);
* ``layer_input:num_layers``: the last decoder layer's *output*, taken with a
  forward hook. HF's ``hidden_states[-1]`` is **not** this state: it has the
  final norm applied.

The captured chunks are concatenated in layout order (the draft's fc input
order): ``[B, T, K*H]``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from eagle3_backend.checkpoint.files import pickle_files
from eagle3_backend.config import DTYPE_ALIASES, DTYPES
from eagle3_backend.errors import TargetError
from eagle3_backend.layout import Layout
from eagle3_backend.target import BUNDLED_GGUF, bundled_target_path, language_model_name, target_path

logger = logging.getLogger(__name__)

__all__ = [
    "BUNDLED_GGUF",
    "HiddenCapture",
    "Target",
    "bundled_target_path",
    "decoder_layers",
    "load_target",
    "load_tokenizer",
    "parse_dtype",
]


def parse_dtype(name: "str | torch.dtype") -> torch.dtype:
    """``"float32"``/``"bf16"``/... -> torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise TargetError(
            f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)} (or {', '.join(DTYPE_ALIASES)})."
        )
    return DTYPES[key]


@dataclass(slots=True)
class Target:
    """A loaded target: model, tokenizer and the shape facts the verifier needs."""

    model: Any  # transformers PreTrainedModel (causal LM), eval mode
    tokenizer: Any
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: torch.dtype
    device: torch.device

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a generation (tokenizer eos + generation_config eos)."""
        ids: set[int] = set()
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        gen = getattr(self.model, "generation_config", None)
        gen_eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        for value in (tok_eos, gen_eos):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)


def resolve_device(device: str | None) -> str:
    """The torch device for ``--device`` (default: cuda if available, else cpu), refused in
    one line when it is not a device name or names a GPU this machine does not have."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise TargetError(f"--device {device!r} is not a torch device; expected cpu, cuda or "
                          "cuda:N.") from None
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise TargetError(f"--device {device}: no CUDA device is visible here (torch CUDA "
                              f"build: {torch.version.cuda or 'none'}). Use --device cpu.")
        if d.index is not None and d.index >= n:
            raise TargetError(f"--device {device}: this machine has {n} CUDA device(s), "
                              f"cuda:0 .. cuda:{n - 1}. Pick one of those.")
    return device


def set_threads(threads: int | None) -> None:
    """``--threads``: torch CPU threads (None keeps torch's default)."""
    if threads is None:
        return
    if threads < 1:
        raise TargetError(f"--threads must be >= 1, got {threads}.")
    torch.set_num_threads(threads)


def allow_pickle_help(takes_draft: bool) -> str:
    """The ``--allow-pickle`` help of commands that load a target (eval, doctor, train)."""
    text = ("accept a target whose weights are .bin/.pt pickle files (read with "
            "torch.load(weights_only=True)); refused by default")
    return text + (". A pickle draft: `eagle3 convert DRAFT OUT --to sglang --allow-pickle` first"
                   if takes_draft else "")


def _weights_kwargs(model_dir: Path, allow_pickle: bool) -> dict[str, Any]:
    """from_pretrained kwargs that keep transformers off pickle weights unless allowed."""
    if any(model_dir.glob("*.safetensors")):
        return {"use_safetensors": True}
    pickles = [f.name for f in pickle_files(model_dir) if f.name != "training_args.bin"]
    if pickles and not allow_pickle:
        raise TargetError(
            f"target {str(model_dir)!r} has its weights only in pickle file(s) "
            f"{', '.join(pickles)}, which can run arbitrary code when loaded, so they are "
            "refused; expected model.safetensors. If you trust them, pass --allow-pickle (read "
            "with torch.load(weights_only=True)), or re-save the model with "
            "save_pretrained(..., safe_serialization=True)."
        )
    return {}


def _raw_config(model_dir: Path) -> dict[str, Any]:
    """The dir's config.json as written; {} when there is none or it is unreadable (then
    transformers' own error names it)."""
    try:
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _refuse_draft(model_dir: Path) -> None:
    """A draft checkpoint given as the target: say so instead of transformers' tokenizer error."""
    raw = _raw_config(model_dir)
    archs = raw.get("architectures")
    names = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if (any("eagle" in a.lower() or "speculator" in a.lower() for a in names)
            or "draft_vocab_size" in raw or "speculators_model_type" in raw):
        raise TargetError(
            f"target {str(model_dir)!r} is an EAGLE-3 draft checkpoint (architectures "
            f"{archs!r}), not a target model. Pass the target (HF model dir or .gguf) as the "
            "target and the draft as the draft."
        )


@contextlib.contextmanager
def transformers_progress(enabled: bool) -> Iterator[None]:
    """transformers' progress bars on or off for the block, its setting restored after.

    Off covers its shard-loading bar (``transformers.utils.logging``) and the GGUF
    de-quantizing bar, which calls ``tqdm`` directly and so ignores that switch.
    """
    if enabled:
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    bar = gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()


def _model_source(path: "str | Path | None") -> tuple[Path, str, dict[str, Any]]:
    """``--target`` as transformers reads it: (the path, the dir to read, gguf_file if any)."""
    p = target_path(path)
    if not p.exists():
        raise TargetError(
            f"target {str(p)!r} does not exist; expected a HF model directory (with "
            "config.json) or a .gguf file. Check --target."
        )
    kwargs: dict[str, Any] = {}
    if p.is_file() and p.name == "config.json":  # what validate and convert take: its model dir
        p = p.parent
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise TargetError(
                f"target {str(p)!r} is a file but not a .gguf; expected a HF model directory "
                "or a GGUF file. Pass the directory that holds config.json."
            )
        return p, str(p.parent), {"gguf_file": p.name}
    ggufs = sorted(p.glob("*.gguf"))
    if not (p / "config.json").is_file():
        if len(ggufs) != 1:
            raise TargetError(
                f"target dir {str(p)!r} has no config.json and {len(ggufs)} .gguf files; "
                "expected a HF model dir or exactly one GGUF. Pass the file itself."
            )
        kwargs["gguf_file"] = ggufs[0].name
    return p, str(p), kwargs


def _unloadable(p: Path, exc: Exception, what: str = "target") -> TargetError:
    why = str(exc).strip().rstrip(".") or type(exc).__name__
    fix = ""
    if why.startswith("Unrecognized configuration class"):
        # transformers lists every causal LM config class it knows (about 200)
        why = why.split(" for this kind of AutoModel")[0] + " is not a causal LM config"
        if isinstance(_raw_config(p).get("text_config"), dict):
            fix = (" It is a multimodal model (its language model is in text_config) whose "
                   "language model the offline tools cannot split off (transformers has no "
                   "causal LM for its text_config, or no tensor is named language_model.* or "
                   "model.language_model.*): give them the language model as a model dir of its "
                   "own (text_config as its config.json, its tensors without the prefix). "
                   "Servers take the model as it is.")
    return TargetError(f"transformers could not load {what} {str(p)!r}: {why}. Expected a causal LM "
                       f"model dir or GGUF file that transformers supports.{fix}")


def load_tokenizer(path: "str | Path | None" = None) -> Any:
    """The tokenizer of a ``--target`` (model dir, ``.gguf`` or ``bundled``), checked as
    :func:`load_target` checks it."""
    from transformers import AutoTokenizer

    p, model_dir, kwargs = _model_source(path)
    try:
        return AutoTokenizer.from_pretrained(model_dir, **kwargs)
    except (OSError, ValueError) as exc:
        raise _unloadable(p, exc, "the tokenizer of") from exc


def _language_model(model_dir: Path, dtype: "torch.dtype", exc: ValueError) -> Any:
    """The causal LM inside a multimodal checkpoint (Kimi-K2.5, Llama 4, Gemma 3: its
    ``text_config``), its tensors renamed from either layout (``language_model.X`` or
    ``model.language_model.X``) into a temporary model dir that transformers loads as it loads
    any (its checkpoint conversions included); re-raises ``exc`` for any other model it cannot
    load as a causal LM. Vision weights are not read."""
    import tempfile

    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    if not model_dir.is_dir():
        raise exc
    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config()
    if text is config:
        raise exc
    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                new = language_model_name(name) or (name if name == "lm_head.weight" else None)
                if new is not None:
                    state[new] = st.get_tensor(name)
    if not state or type(text) not in AutoModelForCausalLM._model_mapping:  # e.g. Qwen2.5-VL's
        raise exc
    with tempfile.TemporaryDirectory(prefix="eagle3-language-model-") as tmp:
        text.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in state.items()}, str(Path(tmp) / "model.safetensors"),
                  metadata={"format": "pt"})
        del state
        what = f"its language model (text_config, {type(text).__name__}) does not match its tensors"
        model, info = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=dtype, use_safetensors=True, output_loading_info=True,
            ignore_mismatched_sizes=True)  # listed in info, refused below
    bad = {k: sorted(info.get(k) or ()) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):  # transformers would run with those weights random
        raise ValueError(f"{what}: " + "; ".join(f"{k.replace('_', ' ')} {[str(x) for x in v[:3]]}"
                                                 + (f" and {len(v) - 3} more" if len(v) > 3 else "")
                                                 for k, v in bad.items() if v)) from exc
    logger.info("target %s: loaded its language model %s from text_config", model_dir,
                type(model).__name__)
    return model


def load_target(
    path: "str | Path | None" = None,
    dtype: "str | torch.dtype" = "float32",
    device: "str | torch.device" = "cpu",
    allow_pickle: bool = False,
    progress: bool = True,
) -> Target:
    """Load a transformers causal LM from a model dir or a ``.gguf`` file.

    ``path=None`` or ``"bundled"`` loads the bundled SmolLM2-135M-Instruct GGUF. A model
    dir is read from its safetensors only; one whose weights are pickle files
    (``pytorch_model.bin``, ``.pt``) is refused unless ``allow_pickle`` (then transformers
    reads them with ``torch.load(weights_only=True)``). ``progress=False`` hides
    transformers' loading bars (see :func:`transformers_progress`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = parse_dtype(dtype)
    p, model_dir, kwargs = _model_source(path)
    if p.is_dir():
        _refuse_draft(p)
        if "gguf_file" not in kwargs:
            kwargs.update(_weights_kwargs(p, allow_pickle))
    logger.info("loading target %s (%s) on %s", p, torch_dtype, device)
    try:
        with transformers_progress(progress):
            tokenizer = AutoTokenizer.from_pretrained(model_dir, **kwargs)
            try:
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, **kwargs)
            except ValueError as exc:
                model = _language_model(p, torch_dtype, exc)
    except (OSError, ValueError) as exc:
        raise _unloadable(p, exc) from exc
    except pickle.UnpicklingError as exc:  # --allow-pickle, but not a plain state dict
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TargetError(
            f"target {str(p)!r}: its pickle weights do not load with torch.load("
            f"weights_only=True) ({first}); expected plain tensors. Re-save the model with "
            "save_pretrained(..., safe_serialization=True) where it was made."
        ) from None
    model.to(device).eval()
    if torch.device(device).type == "cpu":
        _grouped_kv_attention(model)
    if torch.device(device).type == "cpu" and torch_dtype == torch.float32:
        from eagle3_backend.cpu.small_gemm import few_row_linears

        # a k-token verify forward then costs about what a 1-token decode does (see there)
        from eagle3_backend.cpu.layer_ops import fuse_target

        n = few_row_linears(model)
        logger.info("target: %d linear layers use the few-row CPU kernel for 1..16 rows, %d "
                    "RMSNorms the norm kernel", n, fuse_target(model))
    config = model.config
    layers = decoder_layers(model)
    return Target(
        model=model,
        tokenizer=tokenizer,
        path=str(p),
        num_layers=len(layers),
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        dtype=torch_dtype,
        device=torch.device(device),
    )


GROUPED_SDPA = "eagle3_grouped_sdpa"


def grouped_sdpa_attention(module: Any, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: torch.Tensor | None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, except for one case: with a mask (the verifier's tree
    mask) and grouped KV heads, transformers first copies every cached key and value once per
    query head (``repeat_kv``) because it lets SDPA group the heads only without a mask. Here
    SDPA groups them (``enable_gqa``) with the mask too: the same sums on the same numbers
    (bit-equal on CPU, tested) from 1/G of the bytes, about half the time of a 6-token tree
    verify's attention at a few hundred cached tokens. Every other call is transformers' own."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out = _few_query_kernel(module, query, key, value, attention_mask, kwargs)
    if out is not None:
        return out, None
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups == 1 or key.shape[-1] != value.shape[-1]
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=kwargs.get("dropout", 0.0),
        scale=kwargs.get("scaling"), enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


FEW_QUERIES = 16   # a decode, a verify tree, a draft step: more queries go to SDPA
# attention-call arguments that do not change the attention (anything else keeps SDPA)
_PLAIN_KWARGS = frozenset({"dropout", "scaling", "position_ids", "cache_position", "use_cache",
                           "past_key_values", "output_attentions", "sliding_window", "is_causal"})
_mask_memo: list[Any] = [None, None]   # [the last mask given, its new-key block or False]


def _new_key_block(mask: torch.Tensor, t: int) -> "torch.Tensor | bool":
    """bool [T, T]: which of the T new keys each query sees under a transformers 4D mask
    [1, 1, T, L] (bool True = attend, or additive float: 0 = attend), or False when some
    query does not see every earlier key (then the kernel cannot take it). Memoized for the
    last mask: one forward passes the same mask to every layer."""
    if _mask_memo[0] is mask:
        return _mask_memo[1]
    m = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0
    prefix = m.shape[-1] - t
    block = m[:, prefix:].contiguous() if bool(m[:, :prefix].all()) else False
    _mask_memo[:] = [mask, block]
    return block


def _few_query_kernel(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: "torch.Tensor | None", kwargs: dict) -> "torch.Tensor | None":
    """[1, T, Hq, D] from the CPU paged-attention kernel (``cpu.ops.attention.attend_dense``)
    for one sequence's few new queries over its cache, plain causal or under the verifier's
    tree mask; None for anything else (prefills, batches, sliding windows, softcaps, sinks,
    another device or dtype, no kernel). Why: SDPA costs about 2.5x as much for a 6-token
    tree as for one token here, the kernel reads each key once for all rows; and a row's
    result no longer depends on how many tokens are verified with it."""
    t = query.shape[2]
    if (query.device.type != "cpu" or query.shape[0] != 1 or t > FEW_QUERIES
            or not getattr(module, "is_causal", True) or kwargs.get("dropout", 0.0)
            or kwargs.get("sliding_window") or kwargs.get("output_attentions")
            or kwargs.get("is_causal", True) is False or not _PLAIN_KWARGS.issuperset(kwargs)
            or getattr(module, "training", False) or torch.is_grad_enabled()
            or (mask is not None and (mask.dim() != 4 or mask.shape[:2] != (1, 1)
                                      or mask.shape[-2:] != (t, key.shape[2])))):
        return None
    block = None
    if mask is not None:
        block = _new_key_block(mask, t)
        if block is False:
            return None
    from eagle3_backend.cpu.ops.attention import attend_dense

    scale = kwargs.get("scaling")
    out = attend_dense(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                       block, query.shape[-1] ** -0.5 if scale is None else float(scale))
    return None if out is None else out.unsqueeze(0)


def _grouped_kv_attention(model: Any) -> bool:
    """Switch a model that runs transformers' ``sdpa`` attention to :func:`grouped_sdpa_attention`
    (registered once under :data:`GROUPED_SDPA`, masks made as for ``sdpa``). A model on another
    implementation, or one that cannot switch, keeps its own. Returns whether it switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    try:
        model.set_attn_implementation(GROUPED_SDPA)
    except (ValueError, NotImplementedError) as exc:
        logger.info("target keeps sdpa attention: %s", exc)
        return False
    return model.config._attn_implementation == GROUPED_SDPA


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The decoder layer list of a HF causal LM (``model.model.layers`` for Llama-likes)."""
    for attr in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.ModuleList) and len(obj) > 0:
            return obj
    raise TargetError(
        f"cannot find the decoder layers of {type(model).__name__}; expected "
        "model.layers (Llama, Qwen, Mistral, DeepSeek...). This target architecture is "
        "not supported by the offline verifier."
    )


class HiddenCapture:
    """Context manager recording a layout's hidden states on every target forward.

    >>> with HiddenCapture(target.model, layout) as cap:
    ...     target.model(input_ids)
    ...     aux = cap.take()  # [B, T, len(layout) * H], fc input order
    """

    def __init__(self, model: Any, layout: "Layout | str") -> None:
        self.layout = Layout.parse(layout)
        self._layers = decoder_layers(model)
        num_layers = len(self._layers)
        self.layout.check_range(num_layers)
        self._handles: list[Any] = []
        self._store: dict[int, torch.Tensor] = {}
        self._num_layers = num_layers

    def __enter__(self) -> "HiddenCapture":
        wanted = set(self.layout.layers)
        for k in sorted(wanted):
            if k < self._num_layers:
                self._handles.append(
                    self._layers[k].register_forward_pre_hook(self._pre_hook(k), with_kwargs=True)
                )
            else:  # k == num_layers: output of the last layer, before the final norm
                self._handles.append(self._layers[-1].register_forward_hook(self._post_hook(k)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._store.clear()

    def _pre_hook(self, k: int):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._store[k] = hidden
        return hook

    def _post_hook(self, k: int):
        def hook(_module, _args, output):
            self._store[k] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    def take(self) -> torch.Tensor:
        """The states of the last forward, concatenated in layout order: [B, T, K*H]."""
        missing = [k for k in self.layout.layers if k not in self._store]
        if missing:
            raise TargetError(
                f"no hidden state was captured for layers {missing} of layout {self.layout}; "
                "take() must follow a target forward inside the `with HiddenCapture(...)` block."
            )
        out = torch.cat([self._store[k] for k in self.layout.layers], dim=-1)  # [B, T, K*H]
        self._store.clear()
        return out
