"""Every Triton config fits sm_120: shared memory, registers, vector width.

Triton compiles for sm_120 and sm_90 on this CPU machine. Each config is held
to sm_120's 101,376 bytes of shared memory per block (``metadata.shared``) and
to no register spills (the cubin's resource table: sm_120 has no wgmma, so a
GEMM tile's accumulators sit in registers), and the copy kernel to 16-byte
global loads and stores. The probe tests first show each measurement is real:
pipelining stages of a GEMM tile show up in the shared-memory figure, a config
too big for sm_120 is caught, and a tile too big for the register file spills.
"""

from __future__ import annotations

import ast
import collections
import inspect
import re
import types

import pytest

pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from eagle3_backend.ops.triton import capture_into as triton_capture  # noqa: E402
from eagle3_backend.ops.triton import verify_tree as triton_verify  # noqa: E402
from eagle3_backend.ops.triton.resources import (  # noqa: E402
    SM120_SHARED_LIMIT,
    compile_for_target,
    cubin_resources,
    find_cuobjdump,
)


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
    compiled = compile_for_target(_probe_matmul, _PROBE_TYPES, _PROBE_TILE, num_warps=8, num_stages=num_stages)
    return int(compiled.metadata.shared)


def test_measurement_sees_pipeline_stages_and_catches_oversized_configs():
    two, four, five = _probe(2), _probe(4), _probe(5)
    assert two >= 32 * 1024, f"one 128x128x64 bf16 stage needs 32 KB, measured {two}"
    assert four > two, f"num_stages does not show in the figure: 2 -> {two}, 4 -> {four}"
    assert four <= SM120_SHARED_LIMIT < five, (
        f"4 stages ({four} B) fit sm_120's {SM120_SHARED_LIMIT} B, 5 stages ({five} B) must not"
    )


def _needs_cuobjdump() -> None:
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or the triton wheel's)")


def test_register_measurement_sees_spills():
    """A 64x64 tile's accumulators fit a warp group's registers; a 256x256 tile
    (512 fp32 per thread at 4 warps) cannot, and must show up as a spill."""
    _needs_cuobjdump()
    small = cubin_resources(compile_for_target(
        _probe_matmul, _PROBE_TYPES, {"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=2))
    huge = cubin_resources(compile_for_target(
        _probe_matmul, _PROBE_TYPES, {"BM": 256, "BN": 256, "BK": 32}, num_warps=4, num_stages=2))
    assert not small.spills and 0 < small.registers <= 255, small
    assert huge.spills and huge.registers == 255, huge


_VERIFY_TYPES = {
    "predicts_ptr": "*i32", "accept_index_ptr": "*i32", "accept_token_num_ptr": "*i32",
    "candidates_ptr": "*i64", "retrieve_index_ptr": "*i64", "next_token_ptr": "*i64",
    "next_sibling_ptr": "*i64", "target_ptr": "*i64", "num_draft": "i64", "max_accept": "i64",
}


_ONE_WARP = types.SimpleNamespace(num_warps=1, num_stages=1)  # the verify kernel's only launch shape


def _variants():
    for name, body, types, consts, config in triton_capture.launch_variants():
        yield pytest.param(name, body, types, consts, config, id=f"{name}-{_config_id(config)}")
    yield pytest.param("verify_tree_greedy", triton_verify._verify_tree_greedy_kernel, _VERIFY_TYPES, {},
                       _ONE_WARP, id="verify_tree_greedy")


def _config_id(config) -> str:
    if hasattr(config, "block_h"):
        return f"block{config.block_h}-warps{config.num_warps}"
    return "one-warp"


_COMPILED: dict = {}


def _compile(name, body, types, consts, config, capability):
    key = (name, repr(config), tuple(sorted(consts.items())), capability)
    if key not in _COMPILED:
        _COMPILED[key] = compile_for_target(body, types, consts, num_warps=config.num_warps,
                                            num_stages=config.num_stages, capability=capability)
    return _COMPILED[key]


@pytest.mark.parametrize("capability", [120, 90], ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize("name, body, types, consts, config", list(_variants()))
def test_config_fits_shared_memory_and_registers(name, body, types, consts, config, capability):
    compiled = _compile(name, body, types, consts, config, capability)
    used = int(compiled.metadata.shared)
    assert used <= SM120_SHARED_LIMIT, f"{name} {config} needs {used} B of shared memory on sm_{capability}"
    _needs_cuobjdump()
    usage = cubin_resources(compiled)
    assert not usage.spills, (
        f"{name} {config} spills on sm_{capability}: {usage.registers} registers, stack {usage.stack} B, "
        f"local {usage.local} B per thread"
    )


@pytest.mark.parametrize("name, body, types, consts, config",
                         [v for v in _variants() if v.values[0] == "capture_into"])
def test_copy_kernel_moves_data_in_16_byte_accesses(name, body, types, consts, config):
    """At H % 16 == 0 (7168) every global load and store is ld/st.global.v4.b32."""
    ptx = _compile(name, body, types, consts, config, 120).asm["ptx"]
    accesses = collections.Counter(re.findall(r"\b((?:ld|st)\.global[\w.]*)", ptx))
    other = {op: n for op, n in accesses.items() if not op.endswith(".v4.b32")}
    assert other == {}, f"{name} {config}: non-16-byte global accesses {other}"
    assert accesses["ld.global.v4.b32"] > 0 and accesses["st.global.v4.b32"] > 0, accesses


def test_kernels_use_only_triton_builtins():
    """Kernel bodies run both compiled (JITFunction) and interpreted on CPU,
    whatever TRITON_INTERPRET was when triton was imported. Helpers of
    triton.language.standard (tl.zeros, tl.sum, ...) are themselves jit
    functions fixed at import to one of the two modes and break the other,
    so kernels may call only builtins."""
    bodies = [triton_verify._verify_tree_greedy_kernel, *triton_capture.KERNEL_BODIES.values(), _probe_matmul]
    for body in bodies:
        for node in ast.walk(ast.parse(inspect.getsource(body))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id == "tl":
                    member = getattr(tl, node.func.attr)
                    ok = tl.core.is_builtin(member) or inspect.isclass(member)
                    assert ok, f"{body.__name__} calls tl.{node.func.attr}, a jit helper; use builtins only"
