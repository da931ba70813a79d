"""Which backend runs an op: explicit ``backend=`` > $EAGLE3_KERNEL_BACKEND > auto.

Auto order: the compiled CUDA extension (CUDA tensors), then Triton (CUDA
tensors, or CPU tensors when TRITON_INTERPRET=1), then plain torch. Every
backend computes the same bits; a fallback is slower, never different.

An explicit ``backend=`` that cannot run raises KernelError. A backend named
in the environment variable that cannot run for a call falls back to auto,
with one warning per (op, backend, reason).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from dataclasses import dataclass

import torch

from eagle3_backend.config import DTYPES
from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _ext

logger = logging.getLogger(__name__)

BACKENDS = ("cuda", "triton", "torch")
ENV_VAR = "EAGLE3_KERNEL_BACKEND"
_AUTO = "auto"
_SUPPORTED_DTYPES = tuple(DTYPES.values())


@dataclass(frozen=True, slots=True)
class Resolution:
    """The backend an op call runs on and a one-line reason."""

    backend: str
    reason: str

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise KernelError(f"backend {self.backend!r} is not one of {BACKENDS}")


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _why_not(backend: str, device: torch.device, dtypes: tuple[torch.dtype, ...]) -> str | None:
    """None when ``backend`` can run on ``device`` with ``dtypes``, else why not."""
    if backend == "torch":
        return None
    bad = [d for d in dtypes if d not in _SUPPORTED_DTYPES]
    if bad:
        return f"dtype {bad[0]} is not one of {'/'.join(DTYPES)}"
    if backend == "cuda":
        if device.type != "cuda":
            return f"tensors are on {device.type}, the CUDA extension needs CUDA tensors"
        if not _ext.available():
            return f"extension eagle3_backend._C not loaded ({_ext.load_error()})"
        return None
    if not triton_installed():
        return "triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and triton_interpreting():
        return None
    return f"tensors are on {device.type} and TRITON_INTERPRET is not set"


def _requested(backend: str | None) -> tuple[str, str]:
    """(name, where it came from); name is 'auto' when nothing was asked for."""
    if backend is not None:
        source = "backend="
        name = backend
    else:
        source = ENV_VAR
        name = os.environ.get(ENV_VAR, "").strip().lower() or _AUTO
        if name == _AUTO:
            return _AUTO, "auto"
    if name not in (*BACKENDS, _AUTO):
        raise KernelError(
            f"{source} {name!r} is not a kernel backend; expected one of "
            f"{', '.join((*BACKENDS, _AUTO))}. Fix the argument or unset {ENV_VAR}."
        )
    return name, source


@functools.cache
def _warn_once(op: str, backend: str, why: str) -> None:
    logger.warning("%s=%s cannot run %s (%s); using auto dispatch", ENV_VAR, backend, op, why)


def resolve(
    op: str,
    device: torch.device,
    dtypes: tuple[torch.dtype, ...],
    backend: str | None = None,
    *,
    strict_layout: str | None = None,
) -> Resolution:
    """Pick the backend for one call of ``op``.

    ``strict_layout`` is a reason the kernels (not torch) cannot take these
    tensors (e.g. a non-unit inner stride); auto then picks torch.
    """
    name, source = _requested(backend)
    # Everything the decision depends on is in the key (the extension may be
    # JIT-built and TRITON_INTERPRET set after a first call).
    return _decide(op, device.type, dtypes, name, source, strict_layout, triton_interpreting(), _ext.available())


@functools.lru_cache(maxsize=1024)
def _decide(
    op: str,
    device_type: str,
    dtypes: tuple[torch.dtype, ...],
    name: str,
    source: str,
    strict_layout: str | None,
    _interpreting: bool,
    _ext_loaded: bool,
) -> Resolution:
    device = torch.device(device_type)
    if name != _AUTO:
        why = _why_not(name, device, dtypes)
        if why is None and name != "torch" and strict_layout is not None:
            why = strict_layout
        if why is None:
            return Resolution(name, f"requested by {source}")
        if source == "backend=":
            raise KernelError(
                f"{op}: backend={name!r} cannot run this call: {why}. "
                f"Pass backend=None for automatic dispatch."
            )
        _warn_once(op, name, why)
    for candidate in BACKENDS:
        why = _why_not(candidate, device, dtypes)
        if why is None and candidate != "torch" and strict_layout is not None:
            why = strict_layout
        if why is None:
            return Resolution(candidate, f"auto: first available on {device.type}")
    raise AssertionError("torch backend is always available")  # pragma: no cover


def describe(op: str, device: torch.device) -> Resolution:
    """Resolution for a typical call (bf16 tensors on ``device``), with reasons
    for every backend ranked above the chosen one."""
    chosen = resolve(op, device, (torch.bfloat16,))
    skipped = []
    for candidate in BACKENDS:
        if candidate == chosen.backend:
            break
        why = _why_not(candidate, device, (torch.bfloat16,))
        if why is not None:
            skipped.append(f"{candidate}: {why}")
    reason = chosen.reason if not skipped else f"{chosen.reason}; skipped {'; '.join(skipped)}"
    return Resolution(chosen.backend, reason)
