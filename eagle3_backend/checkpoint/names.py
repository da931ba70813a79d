"""Tensor names of each checkpoint format, mapped to this package's (= SGLang's).

============================  ==============================  ================================
ours / SGLang                 also read as                    speculators writes
============================  ==============================  ================================
``midlayer.X``                ``layers.0.X``, ``model.`` pre  ``layers.0.X``
``fc_norm.{0,1,2}``           ``aux_norm_{low,mid,high}``     (not supported)
``layers.N.hidden_norm``      (N >= 1; see below)             ``layers.N.input_layernorm``
``fc``, ``norm``, ``lm_head``, ``embed_tokens``, ``input_norm``, ``d2t``, ``t2d``: same
============================  ==============================  ================================

The reader renames a speculators / vLLM draft's ``layers.N.input_layernorm`` (N >= 1) to
``layers.N.hidden_norm`` (``checkpoint.read``): the same norm, SGLang's name for it.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

from eagle3_backend.errors import CheckpointError

#: Draft ``architectures`` names -> the checkpoint format they are (None: an EAGLE-3 draft of
#: a kind this package does not implement). SGLang 0.5.23 dispatches on this name; its EAGLE-3
#: draft classes are LlamaForCausalLMEagle3 (the one the plugin serves) and
#: Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py).
DRAFT_ARCHS: dict[str, str | None] = {
    "LlamaForCausalLMEagle3": "sglang",
    # vLLM's (and TensorRT-LLM's) name for the same Llama draft; AngelSlim publishes under it
    "Eagle3LlamaForCausalLM": "vllm",
    "EAGLE3LlamaForCausalLM": "vllm",
    "Eagle3Speculator": "speculators",
    "Eagle3DraftModel": "speculators",
    "Eagle3DeepseekV2ForCausalLM": None,  # MLA attention
}
SERVED_DRAFT_ARCHS = tuple(a for a, f in DRAFT_ARCHS.items() if f == "sglang")


#: speculators training-only tensors (frozen copies of the verifier's head); never
#: used at inference, dropped on load with a warning.
TRAINING_ONLY = frozenset({"verifier_lm_head.weight", "verifier_norm.weight"})

_LEGACY = {"aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.", "aux_norm_high.": "fc_norm.2."}


def canonical_name(name: str) -> str:
    """The package's name for a tensor name found in any supported format."""
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    for old, new in _LEGACY.items():
        if name.startswith(old):
            name = new + name[len(old):]
    return name


def to_canonical(tensors: Mapping[str, torch.Tensor], where: str
                 ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename every tensor; returns (renamed, notes). Two names for one tensor is an error."""
    out: dict[str, torch.Tensor] = {}
    first: dict[str, str] = {}
    notes: list[str] = []
    dropped = sorted(n for n in tensors if n in TRAINING_ONLY)
    if dropped:
        notes.append(f"dropped training-only tensors {dropped} (speculators' frozen verifier "
                     f"head; not used for drafting)")
    for name, tensor in tensors.items():
        if name in TRAINING_ONLY:
            continue
        new = canonical_name(name)
        if new in out:
            raise CheckpointError(
                f"{where}: tensors {first[new]!r} and {name!r} are both {new!r}; expected one. "
                f"Remove the duplicate from the checkpoint."
            )
        out[new], first[new] = tensor, name
    return out, notes


_UPPER_LAYER = re.compile(r"^layers\.(\d+)\.")


def upper_layer(name: str) -> int | None:
    """N of a tensor ``layers.N.*`` of a decoder layer after the first (N >= 1; the first
    is ``midlayer.*``), else None."""
    m = _UPPER_LAYER.match(name)
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def to_speculators_name(name: str) -> str:
    """Our (SGLang's) tensor name as speculators writes it: ``midlayer.`` is ``layers.0.``,
    and layers 1+ call their input norm ``input_layernorm`` (SGLang: ``hidden_norm``)."""
    if name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    n = upper_layer(name)
    norm = f"layers.{n}.hidden_norm."
    if n is not None and name.startswith(norm):
        return f"layers.{n}.input_layernorm." + name[len(norm):]
    return name
