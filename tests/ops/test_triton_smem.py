"""Every Triton config fits sm_120's 101,376 bytes of shared memory per block.

Triton compiles for sm_120 on this CPU machine; ``metadata.shared`` is the
shared memory a program needs. The probe tests first show the measurement is
real: pipelining stages of a GEMM tile show up in it, and a config that is
too big for sm_120 is caught.
"""

from __future__ import annotations

import ast
import inspect

import pytest

pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from eagle3_backend.ops.triton import fused_fc as triton_fc  # noqa: E402
from eagle3_backend.ops.triton import gather_concat as triton_gather  # noqa: E402
from eagle3_backend.ops.triton import verify_tree as triton_verify  # noqa: E402
from eagle3_backend.ops.triton.smem import SM120_SHARED_LIMIT, shared_memory_bytes  # noqa: E402


def _probe_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.full((BM, BN), 0.0, dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


_PROBE_TYPES = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
_PROBE_TILE = {"BM": 128, "BN": 128, "BK": 64}  # one stage: 16 KB of A + 16 KB of B


def _probe(num_stages: int) -> int:
    return shared_memory_bytes(_probe_matmul, _PROBE_TYPES, _PROBE_TILE, num_warps=8, num_stages=num_stages)


def test_measurement_sees_pipeline_stages_and_catches_oversized_configs():
    two, four, five = _probe(2), _probe(4), _probe(5)
    assert two >= 32 * 1024, f"one 128x128x64 bf16 stage needs 32 KB, measured {two}"
    assert four > two, f"num_stages does not show in the figure: 2 -> {two}, 4 -> {four}"
    assert four <= SM120_SHARED_LIMIT < five, (
        f"4 stages ({four} B) fit sm_120's {SM120_SHARED_LIMIT} B, 5 stages ({five} B) must not"
    )


@pytest.mark.parametrize(
    "variant",
    list(triton_gather.launch_variants()),
    ids=lambda v: f"{v[0]}-block{v[4].block_h}-warps{v[4].num_warps}",
)
def test_gather_configs_fit_sm120(variant):
    name, body, arg_types, constexprs, config = variant
    used = shared_memory_bytes(
        body, arg_types, constexprs, num_warps=config.num_warps, num_stages=config.num_stages
    )
    assert used <= SM120_SHARED_LIMIT, f"{name} {config} needs {used} B of shared memory on sm_120"


@pytest.mark.parametrize(
    "variant",
    list(triton_fc.launch_variants()),
    ids=lambda v: f"fused_fc-{v[4].block_m}x{v[4].block_n}x{v[4].block_k}-stages{v[4].num_stages}",
)
def test_fused_fc_configs_fit_sm120(variant):
    """The GEMM's pipelined tiles are the project's largest shared-memory user."""
    name, body, arg_types, constexprs, config = variant
    used = shared_memory_bytes(
        body, arg_types, constexprs, num_warps=config.num_warps, num_stages=config.num_stages
    )
    tile_bytes = 2 * (config.block_m + config.block_n) * config.block_k  # one bf16 stage of A and W
    assert used >= tile_bytes, f"{config}: {used} B is less than one stage ({tile_bytes} B): not pipelined?"
    assert used <= SM120_SHARED_LIMIT, f"{name} {config} needs {used} B of shared memory on sm_120"


def test_verify_kernel_fits_sm120():
    types = {
        "predicts_ptr": "*i32", "accept_index_ptr": "*i32", "accept_token_num_ptr": "*i32",
        "candidates_ptr": "*i64", "retrieve_index_ptr": "*i64", "next_token_ptr": "*i64",
        "next_sibling_ptr": "*i64", "target_ptr": "*i64", "num_draft": "i64", "max_accept": "i64",
    }
    used = shared_memory_bytes(triton_verify._verify_tree_greedy_kernel, types, {}, num_warps=1, num_stages=1)
    assert used <= SM120_SHARED_LIMIT


def test_kernels_use_only_triton_builtins():
    """Kernel bodies run both compiled (JITFunction) and interpreted on CPU,
    whatever TRITON_INTERPRET was when triton was imported. Helpers of
    triton.language.standard (tl.zeros, tl.sum, ...) are themselves jit
    functions fixed at import to one of the two modes and break the other,
    so kernels may call only builtins."""
    bodies = [triton_verify._verify_tree_greedy_kernel, *triton_gather.KERNEL_BODIES.values(),
              triton_fc._fused_fc_kernel, _probe_matmul]
    for body in bodies:
        for node in ast.walk(ast.parse(inspect.getsource(body))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id == "tl":
                    member = getattr(tl, node.func.attr)
                    ok = tl.core.is_builtin(member) or inspect.isclass(member)
                    assert ok, f"{body.__name__} calls tl.{node.func.attr}, a jit helper; use builtins only"
