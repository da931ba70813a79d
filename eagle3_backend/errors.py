"""Exceptions raised by eagle3_backend.

Every error message names what was wrong, the value found, what was expected
and how to fix it, so that it can be shown to a user without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Eagle3Error(Exception):
    """Base class of every error this package raises on bad input."""


class LayoutError(Eagle3Error, ValueError):
    """A layout string or engine id list cannot be parsed or translated."""


class LayoutMismatch(Eagle3Error, ValueError):
    """Two layouts (or a layout and a weight shape) disagree."""


class CheckpointError(Eagle3Error, ValueError):
    """A draft checkpoint is malformed, incomplete or inconsistent."""


class TargetError(Eagle3Error, ValueError):
    """A target model description cannot be read or is inconsistent."""


class KernelError(Eagle3Error, ValueError):
    """Bad input to a kernel op (eagle3_backend.ops), or an unavailable backend."""


class ServingError(Eagle3Error, ValueError):
    """SGLang cannot serve this target/draft pair safely (eagle3_backend.serving)."""


ERROR, NOTE = "error", "note"


@dataclass(frozen=True, slots=True)
class Finding:
    """One result of a check, in the words every command prints: "``what`` ``value``;
    expected ``expected``. ``fix``". ``check`` names the check; ``severity`` is ERROR (not
    servable: ``eagle3 validate`` exits 1, the plugin refuses to start) or NOTE;
    ``error`` is the exception class it is raised as."""

    check: str
    what: str
    value: Any
    expected: Any
    fix: str = ""
    severity: str = ERROR
    error: type[Eagle3Error] = CheckpointError

    def __str__(self) -> str:
        text = f"{self.what} {self.value}"
        if self.expected is not None:
            text += f"; expected {self.expected}"
        return f"{text}. {self.fix}" if self.fix else f"{text}."
