"""Draft checkpoints: read SGLang/SpecForge, speculators and EAGLE-repo formats; write
SGLang-native and speculators checkpoints with the canonical layout recorded.

    loaded = load_draft("path/to/draft", target=TargetInfo.from_path("target.gguf"))
    loaded.layout, loaded.layout_source   # e.g. [layer_input:2, ...], "engine-ids"
    save_sglang(loaded, "out/")           # SGLang 0.5.23 loads it unchanged
"""

from eagle3_backend.checkpoint.files import read_config, read_tensors, write_checkpoint
from eagle3_backend.checkpoint.loaded import FORMATS, LAYOUT_SOURCES, LoadedDraft
from eagle3_backend.checkpoint.read import detect_format, load_draft
from eagle3_backend.checkpoint.report import inspect_report

inspect = inspect_report  # the name the team brief uses
from eagle3_backend.checkpoint.write import (
    save_sglang,
    save_speculators,
    sglang_config,
    speculators_config,
    to_layer_order,
    to_layout,
)

__all__ = [
    "FORMATS",
    "LAYOUT_SOURCES",
    "LoadedDraft",
    "detect_format",
    "inspect",
    "inspect_report",
    "load_draft",
    "read_config",
    "read_tensors",
    "save_sglang",
    "save_speculators",
    "sglang_config",
    "speculators_config",
    "to_layer_order",
    "to_layout",
    "write_checkpoint",
]
