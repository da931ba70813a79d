"""Few-row fp32 linear layers on CPU: the C++ kernel in ``kernels/small_gemm.cpp``, and the
builder of the module it shares with ``kernels/paged_attention.cpp`` (``ops/attention.py``)
and ``kernels/layer_ops.cpp`` (``layer_ops.py``).

``small_linear(x, w, bias)`` = ``F.linear`` for x with 1..16 rows, reading each weight
row once for all rows of x (see the .cpp for why and for its summation-order
guarantee: a row's result does not depend on the other rows in the call). A bf16 ``w``
is widened exactly in registers: the result equals ``small_linear(x, w.float(), bias)``
bit for bit, from half the bytes (``packed_linear`` keeps such a copy of weights that
bf16 holds exactly). It is
JIT-built with torch's C++ extension builder on first use (about 45-90 s for the three
sources on a 2-core machine, then cached under
``~/.cache/eagle3-backend/cpu-ext/``, keyed by the sources, the torch version, the flags
and the CPU) with ``-march=native``: it runs on the machine that built it.

``load()`` returns the module, or None when it cannot be built here (no C++
compiler, no ninja) or ``EAGLE3_CPU_SMALL_GEMM=0``; callers then keep their
previous path (``packed_linear``'s oneDNN weights), which gives the same results
up to fp32 summation order. The reason is logged once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

ENV = "EAGLE3_CPU_SMALL_GEMM"
ENV_BF16 = "EAGLE3_CPU_BF16_WEIGHTS"
BF16_STATE = "_eagle3_bf16_weight"
SOURCE = Path(__file__).with_name("kernels") / "small_gemm.cpp"
SOURCES = (SOURCE, SOURCE.with_name("paged_attention.cpp"), SOURCE.with_name("layer_ops.cpp"))
HEADERS = (SOURCE.with_name("vec_exp.h"),)   # included by the sources: part of the build key
MAX_ROWS = 16
CFLAGS = ("-O3", "-march=native", "-fopenmp")

_lock = threading.Lock()
_state: dict[str, Any] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _cpu_fingerprint() -> bytes:
    """The CPU's model and instruction-set flags: a ``-march=native`` build must never be
    loaded on another kind of CPU (a home cache shared between machines)."""
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(keep).encode()
    except OSError:
        return (platform.machine() + platform.processor()).encode()


def build_dir() -> Path:
    """Where the build for this source, torch, flags and CPU lives."""
    key = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS) + torch.__version__.encode()
                         + " ".join(CFLAGS).encode() + _cpu_fingerprint()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "eagle3-backend" / "cpu-ext" / f"small_gemm-{key}"


MODULE_NAME = "eagle3_cpu_small_gemm"


def _import_built(out: Path) -> Any | None:
    """The module from a finished earlier build in ``out`` (whose name already pins the
    source, torch, flags and CPU), imported directly: torch's build step would take the
    build directory's lock and run ninja at every server start even with nothing to
    build. None when there is no usable build (then ``load`` builds)."""
    import importlib.util

    so = out / f"{MODULE_NAME}.so"
    if not so.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as exc:  # a truncated .so from an interrupted link: rebuild
        logger.warning("eagle3_backend.cpu: could not import %s (%s); rebuilding", so, exc)
        return None


def load() -> Any | None:
    """The built extension module, or None (reason logged once). Thread-safe; builds at
    most once per process (concurrent processes share torch's build lock)."""
    if not enabled():
        return None
    with _lock:
        if "module" in _state:
            return _state["module"]
        module = None
        try:
            from torch.utils.cpp_extension import load as jit_load

            out = build_dir()
            out.mkdir(parents=True, exist_ok=True)
            module = _import_built(out)
            if module is None:
                module = jit_load(name=MODULE_NAME, sources=[str(p) for p in SOURCES],
                                  extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                                  build_directory=str(out), verbose=False)
            logger.info("eagle3_backend.cpu: few-row linear, paged attention and layer kernels "
                        "ready (%s, AVX2 %s)", out, module.has_avx2())
        except Exception as exc:  # no compiler / ninja / headers: keep the fallback
            logger.warning("eagle3_backend.cpu: the CPU kernels (%s) could not be built (%s: %s); "
                           "using oneDNN packed weights, torch attention and SGLang's native "
                           "layers instead. Set %s=0 to skip the attempt.",
                           ", ".join(p.name for p in SOURCES), type(exc).__name__,
                           str(exc).splitlines()[0] if str(exc) else "", ENV)
            module = None
        _state["module"] = module
        return module


def supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``small_linear`` takes these operands (fp32 CPU, 1..MAX_ROWS rows)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 2
            and x.device.type == "cpu" and weight.device.type == "cpu"
            and 1 <= rows <= MAX_ROWS and x.shape[-1] == weight.shape[1]
            and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu")))


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 module: Any | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [..., K] with 1..16 rows, fp32 on CPU (weight fp32,
    or bf16 widened exactly).

    Raises RuntimeError when the kernel is unavailable (check ``load()`` first)."""
    mod = module or load()
    if mod is None:
        raise RuntimeError(f"the few-row linear kernel is not available ({ENV}=0 or the build "
                           "failed; see the log).")
    x2 = x.reshape(-1, x.shape[-1])
    fn = mod.small_linear_bf16w if weight.dtype == torch.bfloat16 else mod.small_linear
    out = fn(x2, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def bf16_exact(w: torch.Tensor) -> bool:
    """Whether every element of the fp32 tensor ``w`` is a bf16 value (low 16 bits zero)."""
    return (w.dtype == torch.float32 and w.is_contiguous()
            and not bool((w.detach().view(torch.int32) & 0xFFFF).any()))


def weight_derived(layer: torch.nn.Module, key: str, make: Any) -> Any:
    """``make(layer.weight)``, kept in ``layer.__dict__[key]`` and remade whenever the weight
    tensor is replaced or modified in place (checked by identity and version counter). A
    load through ``param.data`` moves no version: drop ``key`` after it."""
    w = layer.weight
    state = layer.__dict__.get(key)
    if state is None or state[0] is not w or state[1] != w._version:
        state = (w, w._version, make(w))
        layer.__dict__[key] = state
    return state[2]


def _bf16_copy(layer: torch.nn.Module) -> torch.Tensor | None:
    """``layer.weight`` in bf16 when bf16 holds it exactly, else None (:func:`weight_derived`)."""
    return weight_derived(layer, BF16_STATE, lambda w: w.detach().to(torch.bfloat16)
                          if w.dim() == 2 and bf16_exact(w) else None)


def kernel_linear(layer: torch.nn.Module, x: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear(x, layer.weight, bias)`` through the kernel where it takes the operands,
    else None: 1..16 fp32 rows from the weight's exact bf16 copy (half the bytes, the fp32
    kernel's result bit for bit; not with ``EAGLE3_CPU_BF16_WEIGHTS=0``), else from the
    fp32 weight. One row included: the kernel streams a weight faster than F.linear's
    matrix-vector product (see the .cpp), and a token's result is then the same whether it
    is decoded alone or verified with others."""
    w = layer.weight
    if not supports(x, w, bias):
        return None
    mod = load()
    if mod is None:
        return None
    narrow = _bf16_copy(layer) if os.environ.get(ENV_BF16, "1") != "0" else None
    return small_linear(x, w if narrow is None else narrow, bias, module=mod)


def _few_row_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
        out = kernel_linear(self, x, self.bias)
        if out is not None:
            return out
    return torch.nn.functional.linear(x, self.weight, self.bias)


def few_row_linears(model: torch.nn.Module) -> int:
    """Route the fp32 CPU ``nn.Linear`` layers of ``model`` (e.g. a transformers target in
    the offline verifier) through the kernel without autograd (:func:`kernel_linear`): a
    verify forward of a few tokens then costs about what a one-token decode does, and a
    bf16 draft's weights stream half the bytes. More rows, other dtypes and anything that
    needs gradients keep ``F.linear``. Returns the
    number of layers routed (0 when the kernel is unavailable)."""
    if load() is None:
        return 0
    count = 0
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
                and module.weight.device.type == "cpu"):
            module.forward = _few_row_forward.__get__(module)
            count += 1
    return count
