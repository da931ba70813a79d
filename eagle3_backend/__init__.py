"""eagle3_backend: an EAGLE-3 speculative-decoding backend for SGLang.

Importing this package never imports SGLang; only ``eagle3_backend.serving``
(and the CPU serving path) do, lazily.
"""

from eagle3_backend.errors import (
    CheckpointError,
    Eagle3Error,
    LayoutError,
    LayoutMismatch,
    TargetError,
)
from eagle3_backend.layout import EMBED, Layout, Source

__version__ = "0.1.0"

__all__ = [
    "EMBED",
    "CheckpointError",
    "Eagle3Error",
    "Layout",
    "LayoutError",
    "LayoutMismatch",
    "Source",
    "TargetError",
    "__version__",
]
