"""Static resources of a Triton kernel config on a named GPU target, without a GPU.

Triton compiles for any target on a CPU-only machine. Two things decide
whether a config runs well on RTX PRO 6000 Blackwell (sm_120) before it ever
launches there:

* shared memory: ``metadata.shared`` of the result is what one program needs,
  pipelining buffers included. sm_120 gives a block at most 101,376 bytes
  (99 KB); a config tuned on Hopper (227 KB) can fail to launch there.
* registers: sm_120 has no wgmma, so a GEMM tile's accumulators live in the
  registers of its warps (mma.sync); past 255 a thread spills to a stack frame
  in local memory, which costs a round trip to memory in the inner loop. The
  compiled cubin's resource table (``cuobjdump --dump-resource-usage``, the
  binary ships in the triton wheel) gives registers, stack and local bytes.

Pointer and integer arguments are compiled as 16-byte divisible, the way a
real launch on aligned tensors specializes them: without that hint Triton
neither vectorizes nor pipelines, and num_stages would not show in the figure.
"""

from __future__ import annotations

import functools
import inspect
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

SM120_SHARED_LIMIT = 101_376  # bytes per block, sm_120 (RTX PRO 6000 Blackwell)


def compile_for_target(
    body: Callable,
    arg_types: Mapping[str, str],
    constexprs: Mapping[str, object],
    *,
    num_warps: int,
    num_stages: int,
    capability: int = 120,
):
    """Compile the kernel function ``body`` for ``cuda:capability``.

    arg_types: Triton type strings ("*bf16", "i64", ...) for every runtime
    argument; constexprs: value of every constexpr argument. The result's
    ``metadata.shared`` is the shared memory one program needs (bytes);
    :func:`cubin_resources` reads its registers and spills.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    names = list(inspect.signature(body).parameters)
    missing = [n for n in names if n not in arg_types and n not in constexprs]
    if missing:
        raise ValueError(f"{body.__name__}: no type or constexpr value for {missing}")
    signature = {n: ("constexpr" if n in constexprs else arg_types[n]) for n in names}
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n not in constexprs and (signature[n].startswith("*") or signature[n] in ("i32", "i64"))
    }
    source = ASTSource(fn=JITFunction(body), signature=signature, constexprs=dict(constexprs), attrs=aligned)
    return triton.compile(
        source,
        target=GPUTarget("cuda", capability, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


@dataclass(frozen=True, slots=True)
class FunctionResources:
    """One compiled function's per-thread resources, as the cubin records them."""

    name: str
    registers: int
    stack: int  # bytes of stack frame per thread: register spills land here
    local: int  # bytes of other local memory per thread

    @property
    def spills(self) -> bool:
        return self.stack > 0 or self.local > 0


@functools.cache
def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, else the one bundled in the triton wheel, else None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else None


_FUNCTION = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)")
_ARCH = re.compile(r"^arch = (sm_\d+)", re.MULTILINE)


def object_resources(path: str | Path) -> dict[str, list[FunctionResources]]:
    """Per-architecture resources of every function in a cubin, object or fatbin.

    Returns {"sm_120": [FunctionResources, ...], ...} ({"cubin": [...]} for a
    bare cubin, which names no architecture). Raises RuntimeError when
    no cuobjdump is available or it cannot read the file.
    """
    tool = find_cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump not found: install the CUDA toolkit or triton (it bundles one)")
    run = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"cuobjdump --dump-resource-usage {path} failed: {run.stderr.strip()}")
    result: dict[str, list[FunctionResources]] = {}
    sections = _ARCH.split(run.stdout)  # [preamble, arch, body, arch, body, ...]
    if len(sections) == 1:  # a bare cubin has no per-architecture header
        sections = ["", "cubin", run.stdout]
    for arch, body in zip(sections[1::2], sections[2::2]):
        result.setdefault(arch, []).extend(
            FunctionResources(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
            for m in _FUNCTION.finditer(body)
        )
    return result


def cubin_resources(compiled) -> FunctionResources:
    """Resources of a kernel compiled by :func:`compile_for_target` (one function)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(compiled.asm["cubin"])
        functions = [f for fs in object_resources(path).values() for f in fs]
    if len(functions) != 1:
        raise RuntimeError(f"expected one function in the compiled kernel, cuobjdump listed {functions}")
    return functions[0]
