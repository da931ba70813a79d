"""The serving plan: which target states SGLang captures for a draft, and where each one goes.

A draft reads its fc input in *layout* order (``[embed, layer_input:3,
layer_input:31]``). SGLang 0.5.23's target model files capture in *layer* order
from ids whose meaning differs per file (docs/design.md,
"The bug class this project exists to end"). This
module owns the translation for one served pair, the :class:`ServingPlan`:

* ``capture_layers``: the decoder-layer indices ``i`` whose input the model
  file must capture (``layers_to_capture``); ``0`` is the embedding, ``L`` the
  last layer's output (only gpt-oss's model file can capture it);
* ``model_ids()``: the ids to hand the model's own ``set_eagle3_layers_to_capture``
  so that it arrives at exactly ``capture_layers`` (the per-file rules live in
  :data:`eagle3_backend.layout.SGLANG_ID`);
* ``arrival_slots``: the fc slot of the k-th capture in layer order, so captures
  are written straight into their layout position of one [T, K*H] buffer
  (:class:`Collector`, via ``eagle3_backend.ops`` ``capture_into``).

Nothing here imports SGLang: the SGLang-facing classes are in ``serving/collect.py``, and the
check suite (``checkpoint/suite.py``) asks the plan whether a layout can be captured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from eagle3_backend.errors import LayoutError, LayoutMismatch, ServingError
from eagle3_backend.layout import Layout, sglang_captures_last, sglang_id_rule, sglang_ids_for

__all__ = ["ARCHS", "ArchCapture", "Collector", "ServingPlan", "pack_reference", "arch_capture"]


@dataclass(frozen=True, slots=True)
class ArchCapture:
    """How SGLang 0.5.23's model file for one target architecture captures states."""

    architecture: str  # HF ``architectures[0]``, what SGLang dispatches on
    model_class: str  # dotted path of the SGLang class (a USE entry of hooks.HOOKS)
    wraps: str = ""  # the architecture whose setter this file calls with the ids unchanged
    #: attribute path from the SGLang model to the module that holds ``layers_to_capture``
    #: and ``embed_tokens`` (its decoder stack)
    inner: str = "model"

    def __post_init__(self) -> None:
        sglang_id_rule(self.architecture)  # every supported arch has a known id rule
        if self.wraps:
            assert sglang_id_rule(self.wraps) == sglang_id_rule(self.architecture), self

    @property
    def captures_last(self) -> bool:
        """Can capture layer_input:L (the last layer's output, pre-norm): the files whose
        id rule reads ``L`` (gpt-oss)."""
        return sglang_captures_last(self.architecture)


#: Target architectures whose capture this plugin has verified against the model
#: files (tests/test_plan.py runs each file's own id translation).
ARCHS: dict[str, ArchCapture] = {
    a.architecture: a
    for a in (
        ArchCapture("LlamaForCausalLM", "sglang.srt.models.llama.LlamaForCausalLM"),
        # SGLang's MistralForCausalLM is its LlamaForCausalLM (capture and id rule inherited)
        ArchCapture("MistralForCausalLM", "sglang.srt.models.mistral.MistralForCausalLM"),
        ArchCapture("Qwen2ForCausalLM", "sglang.srt.models.qwen2.Qwen2ForCausalLM"),
        ArchCapture("Qwen3ForCausalLM", "sglang.srt.models.qwen3.Qwen3ForCausalLM"),
        ArchCapture("Qwen3MoeForCausalLM", "sglang.srt.models.qwen3_moe.Qwen3MoeForCausalLM"),
        ArchCapture("DeepseekV2ForCausalLM", "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM"),
        # Kimi-K2 and DeepSeek-V3 both declare DeepseekV3ForCausalLM.
        ArchCapture("DeepseekV3ForCausalLM", "sglang.srt.models.deepseek_v2.DeepseekV3ForCausalLM"),
        # Kimi-K2.5: a vision tower around DeepseekV3ForCausalLM, whose setter it calls
        ArchCapture("KimiK25ForConditionalGeneration",
                    "sglang.srt.models.kimi_k25.KimiK25ForConditionalGeneration",
                    wraps="DeepseekV3ForCausalLM", inner="language_model.model"),
        # DeepSeek-V3.2 and GLM-5 (DSA attention, CUDA only: not served on this CPU) are
        # DeepseekV2ForCausalLM subclasses that add nothing to its capture
        ArchCapture("DeepseekV32ForCausalLM", "sglang.srt.models.deepseek_v2.DeepseekV32ForCausalLM"),
        ArchCapture("GlmMoeDsaForCausalLM", "sglang.srt.models.glm4_moe.GlmMoeDsaForCausalLM"),
        ArchCapture("Glm4MoeForCausalLM", "sglang.srt.models.glm4_moe.Glm4MoeForCausalLM"),
        ArchCapture("Glm4MoeLiteForCausalLM", "sglang.srt.models.glm4_moe_lite.Glm4MoeLiteForCausalLM"),
        ArchCapture("GptOssForCausalLM", "sglang.srt.models.gpt_oss.GptOssForCausalLM"),
    )
}


def arch_capture(architecture: str) -> ArchCapture:
    """The capture facts of a target architecture, or a ServingError naming the supported ones."""
    found = ARCHS.get(architecture)
    if found is None:
        raise ServingError(
            f"target architecture {architecture!r} is not supported by the eagle3_backend "
            f"SGLang plugin (supported: {', '.join(sorted(ARCHS))}); its capture of the draft's "
            f"layout cannot be guaranteed. Serve a supported target, or run stock SGLang without "
            f"this plugin (SGLANG_PLUGINS set to a list that omits 'eagle3')."
        )
    return found


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """What the target must capture for one draft, validated on construction."""

    layout: Layout
    architecture: str
    num_layers: int
    hidden_size: int
    draft_path: str
    layout_source: str  # "explicit", "engine-ids", "assumed-default" or "env"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", Layout.parse(self.layout))
        arch = arch_capture(self.architecture)
        for name in ("num_layers", "hidden_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ServingError(f"ServingPlan.{name} must be a positive integer, got {value!r}.")
        self.layout.check_range(self.num_layers)
        if not arch.captures_last and self.num_layers in self.layout.layers:
            raise LayoutError(
                f"layout {self.layout} needs layer_input:{self.num_layers} (the output of the "
                f"last decoder layer), which SGLang 0.5.23's {self.architecture} model file "
                f"cannot capture (it captures layer inputs 0..{self.num_layers - 1} only). The "
                f"draft cannot be served on this target; retrain it without the last layer."
            )
        self.model_ids()  # raises for the one layout no id list can express

    # ------------------------------------------------------------------ derived
    @property
    def capture_layers(self) -> tuple[int, ...]:
        """Layer indices whose input the model captures, ascending (the capture order)."""
        return tuple(sorted(self.layout.layers))

    @property
    def arrival_slots(self) -> tuple[int, ...]:
        """``arrival_slots[k]`` = fc slot of the k-th state the model captures."""
        return self.layout.sorted_order()[1]

    @property
    def fc_in_features(self) -> int:
        return self.layout.fc_in_features(self.hidden_size)

    def model_ids(self) -> list[int]:
        """Ids for the model file's ``set_eagle3_layers_to_capture`` giving ``capture_layers``."""
        return sglang_ids_for(self.capture_layers, self.architecture, self.num_layers,
                              what=f"layout {self.layout}")

    # ------------------------------------------------------------ serialization
    def to_json(self) -> str:
        return json.dumps(
            {
                "layout": self.layout.to_strings(),
                "architecture": self.architecture,
                "num_layers": self.num_layers,
                "hidden_size": self.hidden_size,
                "draft_path": self.draft_path,
                "layout_source": self.layout_source,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> "ServingPlan":
        try:
            raw = json.loads(text)
            return cls(**raw)
        except (TypeError, ValueError) as exc:
            raise ServingError(
                f"the serving plan handed from the launcher is unreadable ({exc}): {text[:200]!r}. "
                f"Start the server again with python -m sglang.launch_server."
            ) from None


def pack_reference(captures: list[torch.Tensor], plan: ServingPlan) -> torch.Tensor:
    """The fc input the draft expects, from captures in the model's (layer) order.

    captures: K tensors [T, H], the k-th captured state in layer order.
    Returns [T, K*H] with slot ``arrival_slots[k]`` = captures[k] (plain torch.cat).
    """
    order = [0] * len(captures)
    for k, slot in enumerate(plan.arrival_slots):
        order[slot] = k
    return torch.cat([captures[k] for k in order], dim=-1)  # [T, K*H]


class Collector:
    """Writes the k-th captured state straight into its layout slot of one [T, K*H] buffer.

    One Collector lives for one target forward. ``out`` is an optional
    preallocated buffer (SGLang's decode graph runner hands one to its packer).
    """

    __slots__ = ("plan", "buffer", "count")

    def __init__(self, plan: ServingPlan, out: torch.Tensor | None = None) -> None:
        self.plan = plan
        self.buffer = out  # [T, K*H] once the first capture arrives
        self.count = 0

    @property
    def num_slots(self) -> int:
        return len(self.plan.layout)

    def _next(self, like: torch.Tensor) -> tuple[int, int]:
        """(slot, H) of the next capture shaped like ``like``; allocates the buffer."""
        K, H = self.num_slots, self.plan.hidden_size
        if self.count >= K:
            raise LayoutMismatch(
                f"the target captured more than {K} hidden states for layout {self.plan.layout} "
                f"(capture layers {list(self.plan.capture_layers)}); expected exactly {K}. The "
                f"{self.plan.architecture} model file captures differently than eagle3_backend "
                f"expects for this SGLang version."
            )
        if like.dim() != 2 or like.shape[1] != H:
            raise LayoutMismatch(
                f"a captured hidden state has shape {tuple(like.shape)}; expected [T, {H}] "
                f"(target hidden size {H}). Sequence- or hidden-sharded captures are not supported."
            )
        if self.buffer is None:
            self.buffer = like.new_empty((like.shape[0], K * H))  # [T, K*H]
        elif tuple(self.buffer.shape) != (like.shape[0], K * H):
            raise LayoutMismatch(
                f"the fc-input buffer is {list(self.buffer.shape)} but capture {self.count} has "
                f"{like.shape[0]} rows; expected [{like.shape[0]}, {K * H}]."
            )
        slot = self.plan.arrival_slots[self.count]
        self.count += 1
        return slot, H

    def write(self, hidden: torch.Tensor) -> None:
        """Copy one captured state (hidden: [T, H]) into its slot."""
        from eagle3_backend.ops.capture_into import capture_into

        slot, _ = self._next(hidden)
        capture_into(self.buffer, slot, hidden)

    def claim(self, like: torch.Tensor) -> torch.Tensor:
        """The next capture's [T, H] view of the buffer, for a producer writing in place."""
        slot, H = self._next(like)
        return self.buffer[:, slot * H : (slot + 1) * H]

    def slot_view(self, slot: int) -> torch.Tensor:
        H = self.plan.hidden_size
        return self.buffer[:, slot * H : (slot + 1) * H]

    @property
    def complete(self) -> bool:
        return self.count == self.num_slots

    def packed(self) -> torch.Tensor:
        """The [T, K*H] fc input in layout order; every slot must have been written."""
        if self.complete:
            return self.buffer
        if self.buffer is not None and self.buffer.shape[0] == 0:
            return self.buffer  # an empty (idle) batch: nothing to pack
        raise LayoutMismatch(
            f"the target captured {self.count} of the {self.num_slots} hidden states of layout "
            f"{self.plan.layout} (capture layers {list(self.plan.capture_layers)}). A layer was "
            f"skipped: two-batch overlap and pipeline parallelism run layers outside the capture "
            f"loop; disable them for EAGLE-3."
        )
