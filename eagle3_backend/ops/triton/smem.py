"""Shared memory of a Triton kernel config on a named GPU target, without a GPU.

Triton compiles for any target on a CPU-only machine; ``metadata.shared`` of
the result is the shared memory one program needs, pipelining buffers
included. RTX PRO 6000 Blackwell (sm_120) gives a block at most 101,376
bytes (99 KB); a config tuned on Hopper (227 KB) can fail to launch there.

Pointer and integer arguments are compiled as 16-byte divisible, the way a
real launch on aligned tensors specializes them: without that hint Triton
neither vectorizes nor pipelines, and num_stages would not show in the figure.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

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
    argument; constexprs: value of every constexpr argument.
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


def shared_memory_bytes(
    body: Callable,
    arg_types: Mapping[str, str],
    constexprs: Mapping[str, object],
    *,
    num_warps: int,
    num_stages: int,
    capability: int = 120,
) -> int:
    """Bytes of shared memory one program of this config needs on the target."""
    compiled = compile_for_target(
        body, arg_types, constexprs, num_warps=num_warps, num_stages=num_stages, capability=capability
    )
    return int(compiled.metadata.shared)
