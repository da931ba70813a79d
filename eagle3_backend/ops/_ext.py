"""Loading of the optional compiled extension ``eagle3_backend._C``.

The extension (csrc/, built by setup.py when torch has CUDA and nvcc exists)
registers ``torch.ops.eagle3.<op>`` for every op of ``table.OPS`` through
TORCH_LIBRARY. This module imports it once,
adds fake (meta) implementations so torch.compile and CUDA graphs can trace
the ops, and can instead JIT-build the same sources with
``torch.utils.cpp_extension.load`` (benchmarks on a fresh GPU box).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from pathlib import Path

import torch

from eagle3_backend.ops.table import CUDA_SOURCES, OP_NAMES, find_cuda_home

logger = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parents[2] / "csrc"

_state: dict[str, object] = {"loaded": False, "error": "not tried yet", "origin": None}


def _ops_registered() -> bool:
    return all(hasattr(torch.ops.eagle3, name) for name in OP_NAMES)


def _register_fakes() -> None:
    """Fake implementations: every op only writes into tensors it was given."""
    for name in OP_NAMES:
        qualname = f"eagle3::{name}"

        def fake(*args, **kwargs) -> None:
            return None

        try:
            torch.library.register_fake(qualname)(fake)
        except RuntimeError as exc:  # already registered (second load path)
            logger.debug("fake for %s not registered again: %s", qualname, exc)


def _finish(origin: str) -> bool:
    if not _ops_registered():
        _state.update(loaded=False, error=f"{origin} loaded but torch.ops.eagle3 ops are missing")
        return False
    _register_fakes()
    _state.update(loaded=True, error=None, origin=origin)
    logger.info("eagle3 CUDA extension loaded from %s", origin)
    return True


@functools.cache
def _try_import() -> bool:
    if os.environ.get("EAGLE3_DISABLE_CUDA_EXT", "0") == "1":
        _state["error"] = "disabled by EAGLE3_DISABLE_CUDA_EXT=1"
        return False
    try:
        module = importlib.import_module("eagle3_backend._C")
    except ImportError as exc:
        _state["error"] = f"not built ({exc.__class__.__name__}: {exc})"
        return False
    except OSError as exc:  # built for another torch/CUDA
        _state["error"] = f"failed to load: {exc}"
        return False
    return _finish(getattr(module, "__file__", "eagle3_backend._C"))


def available() -> bool:
    """True when the compiled ops are registered (imports the extension once)."""
    return bool(_state["loaded"]) or _try_import()


def load_error() -> str | None:
    available()
    return None if _state["loaded"] else str(_state["error"])


def origin() -> str | None:
    return _state["origin"] if _state["loaded"] else None  # type: ignore[return-value]


def load_library(path: str | os.PathLike) -> bool:
    """Load a built extension library from ``path`` (e.g. a build/ tree) and register fakes."""
    if available():
        return True
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        _state["error"] = f"failed to load {path}: {exc}"
        return False
    return _finish(str(path))


def jit_build(*, verbose: bool = False, build_dir: str | None = None) -> bool:
    """Compile csrc/ now with torch.utils.cpp_extension.load and register the ops.

    For a machine with torch + nvcc where setup.py was not run (benchmarks).
    Uses the GPU's own arch unless TORCH_CUDA_ARCH_LIST is set.
    """
    if available():
        return True
    home = find_cuda_home()
    if home is not None and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = str(home)
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import load

    current = cpp_extension.CUDA_HOME
    if home is not None and (current is None or not (Path(current) / "include" / "cuda_runtime.h").exists()):
        # torch guessed the root from an nvcc wrapper script (e.g. /usr/local/bin/nvcc -> /usr/local).
        logger.info("using CUDA toolkit %s instead of torch's guess %s", home, current)
        cpp_extension.CUDA_HOME = str(home)

    sources = [str(CSRC / name) for name in CUDA_SOURCES]
    try:
        load(
            name="eagle3_backend_C_jit",
            sources=sources,
            extra_include_paths=[str(CSRC)],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            build_directory=build_dir,
            is_python_module=False,
            verbose=verbose,
        )
    except (RuntimeError, OSError) as exc:
        _state["error"] = f"JIT build failed: {exc}"
        logger.warning("eagle3 CUDA extension JIT build failed: %s", exc)
        return False
    return _finish("jit build of csrc/")
