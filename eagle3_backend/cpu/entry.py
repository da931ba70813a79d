"""The ``sglang.srt.platforms`` entry point: ``activate()``.

SGLang calls ``activate()`` in every process (main, scheduler, detokenizer)
when ``sglang.srt.utils.common`` first resolves ``current_platform``, which is
before any model code runs ``import sgl_kernel``. It returns the qualified
name of the platform class, or None when this plugin does not apply (no
``SGLANG_USE_CPU_ENGINE=1``), so GPU users of this package are unaffected.

This module must stay import-light: no sglang, no torch at import time.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

PLATFORM_CLASS = "eagle3_backend.cpu.platform:Eagle3CpuPlatform"
# Set to "0" to keep this package installed but leave SGLang's CPU engine alone.
ENV_ENABLE = "EAGLE3_CPU_PLATFORM"


def applies() -> bool:
    """True when SGLang runs its CPU engine and the user has not opted out."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") != "1":
        return False
    return os.environ.get(ENV_ENABLE, "1") != "0"


def _default_omp_wait_policy() -> None:
    """Make idle OpenMP threads sleep instead of spin, unless the user chose a policy.

    libgomp's default spins a waiting thread for ~300k iterations at every
    barrier. SGLang's CPU engine runs its model threads next to its own
    tokenizer, detokenizer and HTTP processes; on a machine with few cores
    (or shared with other work) the spinning threads take the cores the
    working ones need. Measured on this project's 2-core CI machine under
    load, SmolLM2-135M fp32 greedy decode with 2 threads: 1830 ms/token by
    default, 84 ms/token with GOMP_SPINCOUNT=0 (1 thread: 77 ms). Set here,
    in the launcher, it reaches the scheduler processes SGLang spawns later.
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "0"


def activate() -> str | None:
    """Install the CPU ops and return the platform class, or None if not applicable."""
    if not applies():
        return None
    from eagle3_backend.cpu import sgl_kernel_shim

    sgl_kernel_shim.install()
    _default_omp_wait_policy()
    return PLATFORM_CLASS
