"""`LoadedDraft`: one in-memory form for every checkpoint format."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from eagle3_backend.config import DraftConfig
from eagle3_backend.layout import Layout

#: checkpoint formats this package reads.
FORMATS = ("sglang", "vllm", "speculators", "eagle-repo")

#: how the layout of a loaded draft was known, most to least trustworthy.
LAYOUT_SOURCES = ("explicit", "engine-ids", "assumed-default")


@dataclass(frozen=True, slots=True, eq=False)
class LoadedDraft:
    """A draft checkpoint read into this package's own names.

    ``state_dict`` uses the names of :class:`eagle3_backend.model.Eagle3DraftModel`
    (SGLang's EAGLE-3 checkpoint names: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``,
    ``d2t``, ``t2d`` ...), tensors in the checkpoint's own dtype. ``layout_source`` says
    how the layout was known and ``layout_explanation`` says it in words.
    ``target_architecture`` / ``target_num_layers`` are the target the checkpoint
    records (or the one given on load), None when unknown. ``problems`` is empty
    unless the draft was read with ``strict=False``.
    """

    path: str
    format: str
    config: DraftConfig
    state_dict: Mapping[str, torch.Tensor]
    layout_source: str
    layout_explanation: str
    target_architecture: str | None = None
    target_num_layers: int | None = None
    sglang_ids: tuple[int, ...] | None = None  # eagle_config ids as stored, if any
    stored_names: tuple[str, ...] | None = None  # tensor names as stored (read from disk only)
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    raw_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} not in {FORMATS}")
        if self.layout_source not in LAYOUT_SOURCES:
            raise ValueError(f"layout_source {self.layout_source!r} not in {LAYOUT_SOURCES}")

    @property
    def layout(self) -> Layout:
        return self.config.layout

    @property
    def dtype(self) -> str:
        return self.config.dtype

    @property
    def has_d2t(self) -> bool:
        """True when the draft vocabulary is a strict subset mapped through d2t."""
        return "d2t" in self.state_dict and self.config.uses_vocab_map

    @property
    def num_parameters(self) -> int:
        """Number of weights (floating tensors; the d2t/t2d maps are not counted)."""
        return sum(t.numel() for t in self.state_dict.values() if t.is_floating_point())
