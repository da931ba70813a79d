"""A stand-in ``sgl_kernel`` module for SGLang's CPU engine.

The ``sgl_kernel`` wheel on PyPI is built for CUDA only: on a machine without
the CUDA driver ``import sgl_kernel`` fails, and SGLang's CPU code paths do
``from sgl_kernel import <op>_cpu`` at import time. ``install()`` registers
this package's torch implementations as ``torch.ops.sgl_kernel.*`` and puts a
module named ``sgl_kernel`` in ``sys.modules`` whose attributes are exactly
those ops. Anything else is missing, loudly: ``from sgl_kernel import X``
raises ``ImportError: cannot import name 'X' from 'sgl_kernel'`` and
``sgl_kernel.X`` raises an AttributeError naming X and this package, so an
op SGLang needs but nobody implemented is never silently replaced.

The real module is left alone when it imports and already serves the CPU
(a CPU build of sgl-kernel registers ``torch.ops.sgl_kernel.decode_attention_cpu``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import types

logger = logging.getLogger(__name__)

MODULE_NAME = "sgl_kernel"
_MARKER = "__eagle3_cpu_stand_in__"


class MissingCpuOp(AttributeError):
    """An sgl_kernel attribute SGLang asked for that this package does not implement."""


def is_installed() -> bool:
    """True when sys.modules['sgl_kernel'] is this package's stand-in."""
    mod = sys.modules.get(MODULE_NAME)
    return mod is not None and getattr(mod, _MARKER, False)


def real_module_serves_cpu() -> bool:
    """Import the real sgl_kernel if possible; True when it brings the CPU ops."""
    import torch

    if is_installed():
        return False
    if importlib.util.find_spec(MODULE_NAME) is None:
        return False
    try:
        importlib.import_module(MODULE_NAME)
    except Exception as exc:  # the CUDA wheel raises ImportError/OSError without libcuda
        logger.debug("real sgl_kernel does not import here (%s)", exc)
        for name in [m for m in sys.modules if m == MODULE_NAME or m.startswith(MODULE_NAME + ".")]:
            del sys.modules[name]
        return False
    return hasattr(torch.ops.sgl_kernel, "decode_attention_cpu")


def build_module() -> types.ModuleType:
    """The stand-in module: one attribute per registered op, nothing else."""
    import torch

    from eagle3_backend.cpu.ops import registry

    mod = types.ModuleType(MODULE_NAME, __doc__)
    mod.__spec__ = importlib.machinery.ModuleSpec(MODULE_NAME, None, is_package=True)
    mod.__path__ = []  # a package with no submodules: `import sgl_kernel.x` fails, naming x
    mod.__file__ = __file__
    setattr(mod, _MARKER, True)
    ops = getattr(torch.ops, registry.NAMESPACE)
    for name in registry.registered():
        setattr(mod, name, getattr(ops, name))

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise MissingCpuOp(
            f"sgl_kernel op {name!r} has no CPU implementation: SGLang asked the "
            f"stand-in sgl_kernel module of eagle3_backend.cpu for it (provided: "
            f"{', '.join(registry.registered())}). Add it to eagle3_backend/cpu/ops, "
            "or serve this model on a GPU.")

    mod.__getattr__ = __getattr__
    return mod


def install() -> bool:
    """Register the ops and install the stand-in unless a CPU-capable sgl_kernel exists.

    Returns True when the stand-in is (now) installed. Idempotent.
    """
    if is_installed():
        return True
    if real_module_serves_cpu():
        logger.info("real sgl_kernel serves the CPU; eagle3_backend.cpu stand-in not installed")
        return False
    from eagle3_backend.cpu.ops import registry

    registry.register_all()
    sys.modules[MODULE_NAME] = build_module()
    logger.info("installed the eagle3_backend.cpu stand-in for sgl_kernel (%d ops)",
                len(registry.registered()))
    return True
