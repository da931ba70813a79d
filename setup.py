"""Build of the optional CUDA extension ``eagle3_backend._C`` (csrc/).

Metadata lives in pyproject.toml; this file only decides whether to compile
csrc/ and how. The extension is built when torch is importable at build time
(use ``pip install --no-build-isolation .``) with a CUDA build, nvcc exists
and ``EAGLE3_SKIP_CUDA_BUILD`` is not 1. Otherwise the install is pure
Python, with a warning; the package then runs its Triton and torch backends.

Environment:
  EAGLE3_SKIP_CUDA_BUILD=1       never build the extension
  EAGLE3_CUDA_ARCHS="8.0;9.0;12.0"  compute capabilities (12.0 needs nvcc >= 12.8)
  EAGLE3_REQUIRE_CUDA_BUILD=1    make a failed or skipped build an error
  CUDA_HOME                      toolkit root (found from nvcc otherwise)
Nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
DEFAULT_ARCHS = "8.0;9.0;12.0"

def _table() -> dict:
    """eagle3_backend/ops/table.py's names (standard library only: no torch needed)."""
    table: dict = {}
    exec((ROOT / "eagle3_backend" / "ops" / "table.py").read_text(encoding="utf-8"), table)
    return table


def _cuda_sources() -> list[str]:
    """csrc/ files to compile, from the ops table."""
    return [f"csrc/{name}" for name in _table()["CUDA_SOURCES"]]


def find_cuda_home() -> Path | None:
    return _table()["find_cuda_home"]()


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def nvcc_version(nvcc: Path) -> tuple[int, int] | None:
    try:
        text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def gencode_flags(archs: str, version: tuple[int, int]) -> list[str]:
    """-gencode flags for 'X.Y;...' (SASS for each, PTX for the newest)."""
    caps = []
    for item in archs.replace(",", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        if not re.fullmatch(r"\d+\.\d+", item):
            raise SystemExit(f"EAGLE3_CUDA_ARCHS entry {item!r} is not like '9.0'; got {archs!r}")
        major, minor = (int(x) for x in item.split("."))
        if major >= 12 and version < (12, 8):
            warnings.warn(f"nvcc {version[0]}.{version[1]} cannot target sm_{major}{minor} (needs >= 12.8); skipped")
            continue
        caps.append(f"{major}{minor}")
    if not caps:
        raise SystemExit(f"EAGLE3_CUDA_ARCHS={archs!r} leaves no architecture nvcc can build")
    flags = [f"-gencode=arch=compute_{c},code=sm_{c}" for c in caps]
    newest = max(caps, key=int)
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


def _skip(reason: str) -> dict:
    message = f"eagle3_backend: not building the CUDA extension ({reason}); installing pure Python"
    if _flag("EAGLE3_REQUIRE_CUDA_BUILD"):
        raise SystemExit(message.replace("not building", "EAGLE3_REQUIRE_CUDA_BUILD=1 but not building"))
    warnings.warn(message)
    print(message, file=sys.stderr)
    return {}


def extension_kwargs() -> dict:
    if _flag("EAGLE3_SKIP_CUDA_BUILD"):
        return _skip("EAGLE3_SKIP_CUDA_BUILD=1")
    home = find_cuda_home()
    if home is None:
        return _skip("nvcc not found; set CUDA_HOME")
    os.environ.setdefault("CUDA_HOME", str(home))  # before torch.utils.cpp_extension reads it
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    except ImportError as exc:
        return _skip(f"torch is not importable at build time ({exc}); use --no-build-isolation")
    if torch.version.cuda is None:
        return _skip(f"torch {torch.__version__} is a CPU-only build")
    version = nvcc_version(home / "bin" / "nvcc")
    if version is None:
        return _skip(f"{home / 'bin' / 'nvcc'} --version failed")
    archs = os.environ.get("EAGLE3_CUDA_ARCHS", DEFAULT_ARCHS)
    extension = CUDAExtension(
        name="eagle3_backend._C",
        sources=_cuda_sources(),
        include_dirs=[str(CSRC)],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", *gencode_flags(archs, version)]},
    )

    class OptionalBuildExtension(BuildExtension):
        """A failed compile warns and leaves a pure-Python install, unless required."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as exc:  # compiler errors surface as several exception types
                if _flag("EAGLE3_REQUIRE_CUDA_BUILD"):
                    raise
                _skip(f"the build failed: {exc}")

    print(f"eagle3_backend: building CUDA extension for {archs} with nvcc {version[0]}.{version[1]}", file=sys.stderr)
    return {"ext_modules": [extension], "cmdclass": {"build_ext": OptionalBuildExtension}}


MIN_SETUPTOOLS = (77, 0)  # pyproject.toml's `license = "Apache-2.0"` (an SPDX string, PEP 639)


def check_setuptools(version: str) -> None:
    """Stop with the fix when the running setuptools cannot read pyproject.toml.

    ``pip install --no-build-isolation .`` (the CUDA build) uses the
    environment's setuptools, not the one pyproject.toml asks for; older ones
    stop on the license field with a schema dump that does not say what to do.
    """
    parts = re.match(r"(\d+)\.(\d+)", version)
    found = (int(parts.group(1)), int(parts.group(2))) if parts else (0, 0)
    if found < MIN_SETUPTOOLS:
        need = ".".join(map(str, MIN_SETUPTOOLS))
        raise SystemExit(
            f"eagle3_backend: setuptools {version} is too old to build this package (needs >= {need}); "
            f"run `python -m pip install 'setuptools>={need}'` first, or install without "
            "--no-build-isolation (the install is then pure Python, without the CUDA extension)."
        )


if __name__ == "__main__":  # also true when setuptools' build backend runs this file
    import setuptools

    check_setuptools(setuptools.__version__)
    setup(**extension_kwargs())
