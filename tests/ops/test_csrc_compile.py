"""csrc/ compiles without a GPU: every .cu for sm_90 and sm_120, and setup.py
builds the extension, whose ops register (with fakes) and check their inputs.

Needs nvcc (skips without it: the CI image has it). The standalone .cu
compile includes no torch header, so it is quick; each file is compiled once
for both architectures, the files in parallel.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from eagle3_backend.ops.table import CUDA_SOURCES
from eagle3_backend.ops.triton.resources import find_cuobjdump, object_resources

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
CU_FILES = [CSRC / name for name in CUDA_SOURCES if name.endswith(".cu")]
ARCHS = ("90", "120")


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    return nvcc


@pytest.fixture(scope="module")
def compiled_objects(tmp_path_factory) -> dict[str, Path]:
    nvcc = _nvcc()
    out_dir = tmp_path_factory.mktemp("csrc")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]

    def compile_one(cu: Path) -> tuple[str, subprocess.CompletedProcess, Path]:
        obj = out_dir / (cu.stem + ".o")
        cmd = [nvcc, "-std=c++17", "-O3", "--Werror", "all-warnings", "-Xcompiler", "-Wall",
               f"-I{CSRC}", "-c", str(cu), "-o", str(obj), *gencode]
        return cu.name, subprocess.run(cmd, capture_output=True, text=True, timeout=600), obj

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, CU_FILES))
    failures = [f"{name}:\n{proc.stderr[-3000:]}" for name, proc, _ in results if proc.returncode != 0]
    assert not failures, "nvcc failed:\n" + "\n".join(failures)
    return {name: obj for name, _, obj in results}


def test_every_cu_file_compiles_for_sm90_and_sm120(compiled_objects):
    assert set(compiled_objects) == {p.name for p in CU_FILES}
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        return
    for name, obj in compiled_objects.items():
        listing = subprocess.run([cuobjdump, "--list-elf", str(obj)], capture_output=True, text=True).stdout
        for arch in ARCHS:
            assert f"sm_{arch}" in listing, f"{name} has no sm_{arch} code:\n{listing}"


def test_capture_kernel_uses_16_byte_accesses(compiled_objects):
    """The bf16 -> bf16 vector kernels (with and without a residual; 4 vectors a thread,
    and 1 for decode-sized launches) move data with 128-bit loads and stores."""
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not available")
    sass = subprocess.run(
        [cuobjdump, "-sass", "-arch", "sm_120", str(compiled_objects["capture_into.cu"])],
        capture_output=True, text=True, check=True,
    ).stdout
    functions = re.split(r"\n\s*Function : ", sass)
    vector = [f for f in functions if re.match(r"\S*capture_into_kernelI13__nv_bfloat16S\d_Li8ELb[01]ELi[14]E", f)]
    assert len(vector) == 4, "bf16 -> bf16 vector kernels (residual or not, unroll 1 or 4) not found in sm_120 SASS"
    assert all("LDG.E.128" in f and "STG.E.128" in f for f in vector)


def test_cuda_kernels_do_not_spill(compiled_objects):
    """Every kernel instantiation, on both architectures, keeps its state in
    registers: no stack frame, no local memory."""
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not available")
    for name, obj in compiled_objects.items():
        per_arch = object_resources(obj)
        assert set(per_arch) == {f"sm_{a}" for a in ARCHS}, f"{name}: {sorted(per_arch)}"
        for arch, functions in per_arch.items():
            assert functions, f"{name}: no functions listed for {arch}"
            spilled = [f for f in functions if f.spills]
            assert not spilled, f"{name} spills on {arch}: {spilled}"


_LOAD_CHECK = textwrap.dedent(
    """
    import sys, torch
    from eagle3_backend.ops import _ext
    assert _ext.load_library(sys.argv[1]), _ext.load_error()
    ops = torch.ops.eagle3
    assert "Tensor(a!) buffer" in str(ops.capture_into.default._schema)
    # Fake kernels: meta tensors trace through without touching data.
    meta = dict(device="meta")
    ops.capture_into(torch.empty(4, 16, **meta), 1, torch.empty(4, 8, **meta), None)
    # Input checks run before the device check and name the tensor.
    hidden = torch.zeros(4, 8)
    cases = [
        (lambda: ops.capture_into(torch.empty(4, 16), 2, hidden, None), "slot must be in [0, 2)"),
        (lambda: ops.capture_into(torch.empty(4, 17), 0, hidden, None), "buffer width 17 is not a multiple"),
        (lambda: ops.capture_into(torch.empty(3, 16), 0, hidden, None), "buffer has 3 rows but hidden has 4"),
        (lambda: ops.capture_into(torch.empty(4, 16), 0, hidden, torch.zeros(4, 9)), "residual has shape"),
        (lambda: ops.capture_into(torch.empty(4, 16), 0, hidden, None), "buffer must be a CUDA tensor"),
        (lambda: ops.verify_tree_greedy(*[torch.zeros(1, dtype=torch.int32)] * 3, *[torch.zeros(1, 1)] * 5),
         "candidates must be a CUDA tensor"),
    ]
    for call, message in cases:
        try:
            call()
        except RuntimeError as exc:
            assert message in str(exc), (message, str(exc))
        else:
            raise AssertionError("no error for " + message)
    print("OK")
    """
)


def test_setup_py_builds_extension_and_ops_register(tmp_path):
    _nvcc()
    if torch.version.cuda is None:
        pytest.skip("torch in this environment is a CPU-only build")
    env = dict(os.environ, EAGLE3_CUDA_ARCHS="12.0", MAX_JOBS="2", EAGLE3_REQUIRE_CUDA_BUILD="1")
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    libs = list((tmp_path / "lib" / "eagle3_backend").glob("_C*.so"))
    assert len(libs) == 1, f"no _C library built: {build.stdout[-2000:]}"
    assert "-gencode=arch=compute_120,code=sm_120" in build.stdout + build.stderr

    (tmp_path / "check.py").write_text(_LOAD_CHECK)
    check = subprocess.run(
        [sys.executable, str(tmp_path / "check.py"), str(libs[0])],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300,
    )
    assert check.returncode == 0 and "OK" in check.stdout, check.stderr[-4000:]


def _setup_module():
    spec = importlib.util.spec_from_file_location("eagle3_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only: setup() runs under __main__
    return module


@pytest.mark.parametrize("version", ["77.0.0", "77.0.3", "80.9.0", "84.2.1", "100.0"])
def test_setup_py_accepts_setuptools_that_reads_the_spdx_license(version):
    _setup_module().check_setuptools(version)


@pytest.mark.parametrize("version", ["65.5.0", "68.2.2", "76.1.0", "unknown"])
def test_setup_py_names_the_fix_for_an_old_setuptools(version):
    """`pip install --no-build-isolation .` runs the environment's setuptools;
    before 77 it cannot read `license = "Apache-2.0"` and dumps a schema."""
    with pytest.raises(SystemExit) as exc:
        _setup_module().check_setuptools(version)
    assert str(exc.value).startswith(f"eagle3_backend: setuptools {version} is too old to build this package "
                                     "(needs >= 77.0); run `python -m pip install 'setuptools>=77.0'` first")


def test_setup_py_without_cuda_is_pure_python(monkeypatch):
    module = _setup_module()
    monkeypatch.setenv("EAGLE3_SKIP_CUDA_BUILD", "1")
    with pytest.warns(UserWarning, match=r"not building the CUDA extension \(EAGLE3_SKIP_CUDA_BUILD=1\)"):
        assert module.extension_kwargs() == {}
    monkeypatch.setenv("EAGLE3_REQUIRE_CUDA_BUILD", "1")
    with pytest.raises(SystemExit, match="EAGLE3_REQUIRE_CUDA_BUILD=1 but not building"):
        module.extension_kwargs()


def test_setup_py_arch_flags():
    module = _setup_module()
    flags = module.gencode_flags("8.0;9.0;12.0", (13, 0))
    assert flags == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    with pytest.warns(UserWarning, match="needs >= 12.8"):
        old = module.gencode_flags("8.0;9.0;12.0", (12, 4))
    assert old == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    with pytest.raises(SystemExit, match="not like '9.0'"):
        module.gencode_flags("sm_90", (13, 0))
