"""Results files and plots for ``eagle3 eval`` / ``eagle3 bench``.

:func:`write_results` writes ``<dir>/<name>.json`` (default dir:
``benchmarks/results``) holding the run's payload plus what is needed to
reproduce or compare it: machine, package versions, settings, git revision.
The ``plot_*`` functions write PNGs with matplotlib's Agg backend.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagle3_backend.errors import Eagle3Error

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RESULTS_DIR",
    "environment",
    "check_output_dir",
    "check_plot_path",
    "git_revision",
    "machine_info",
    "package_version",
    "plot_acceptance_histogram",
    "plot_spec_vs_baseline",
    "plot_tokens_per_s_vs_concurrency",
    "versions",
    "write_results",
]

DEFAULT_RESULTS_DIR = Path("benchmarks") / "results"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: The packages whose versions ``eagle3 env`` shows and every results file records.
PACKAGES = ("torch", "triton", "transformers", "sglang", "sgl-kernel", "flashinfer-python",
            "safetensors", "gguf", "numpy")


def machine_info() -> dict[str, Any]:
    """CPU / GPU / OS facts of this machine."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions (None when not installed); reads metadata, imports nothing."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_revision(cwd: str | Path | None = None) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None} of the repository at ``cwd``."""
    cwd = str(cwd or Path(__file__).resolve().parents[2])

    def git(*args: str) -> str | None:
        try:
            # read-only: no index refresh, so no .git/index.lock to collide with the user's git
            res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                                 timeout=10, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_version() -> str:
    """This package's installed version, or its ``__version__`` in a source checkout."""
    from eagle3_backend import __version__

    return versions(["eagle3-backend"])["eagle3-backend"] or __version__


def environment() -> dict[str, Any]:
    """Machine, package versions, git revision and the command that ran (this process's
    ``sys.argv``): what a results file records."""
    import shlex
    import sys

    vers = {**versions(), "eagle3-backend": package_version()}
    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": vers,
        "git": git_revision(),
        "command": shlex.join(sys.argv),
    }


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise Eagle3Error(
            f"results name {name!r} must be letters, digits, '.', '_' or '-' (a file stem), "
            "e.g. 'eval-smollm2-chain3'."
        )


def _probe_dir(out: Path, flag: str) -> None:
    """Create ``out`` and write (then remove) a file in it, or say which flag to change."""
    if out.exists() and not out.is_dir():
        raise Eagle3Error(f"{flag} {out}: {out} is a file; expected a directory. Choose another "
                          f"{flag}.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".eagle3-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise Eagle3Error(
            f"{flag} {out}: cannot write there ({exc.strerror or exc}); checked before the run so "
            f"its results are not lost at the end. Choose a writable {flag}."
        ) from None


def _check_not_foreign(path: Path) -> None:
    """An existing ``<name>.json`` is replaced only when it is an earlier results file
    (name, settings, results, environment): never a config.json or other JSON."""
    if not path.exists():
        return
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        ours = isinstance(doc, dict) and {"name", "settings", "results", "environment"} <= set(doc)
    except (OSError, UnicodeDecodeError, ValueError):
        ours = False
    if not ours:
        raise Eagle3Error(f"{path} exists and is not an eagle3 results file; refusing to "
                          f"overwrite it. Choose another --name or --output-dir.")


def check_output_dir(name: str, out_dir: str | Path | None = None) -> Path:
    """Refuse a bad results name, a name that would overwrite a file that is not an earlier
    results file, or an unwritable directory, before a run, not after it."""
    _check_name(name)
    out = Path(out_dir) if out_dir is not None else DEFAULT_RESULTS_DIR
    _check_not_foreign(out / f"{name}.json")
    _probe_dir(out, "--output-dir")
    return out


def check_plot_path(path: str | Path, flag: str = "--plot") -> Path:
    """Refuse a plot file matplotlib cannot write (unknown format, a directory, unwritable
    place) before the run that would draw it."""
    from matplotlib.backend_bases import FigureCanvasBase

    out = Path(path)
    kinds = FigureCanvasBase.get_supported_filetypes()
    fmt = out.suffix[1:].lower()
    if fmt not in kinds:
        raise Eagle3Error(f"{flag} {out}: {'no' if not fmt else repr(fmt)} file format; expected "
                          f"one of {', '.join(sorted(kinds))}. Give the file a suffix such as "
                          f".png.")
    if out.is_dir():
        raise Eagle3Error(f"{flag} {out} is a directory; expected a file name. Pass e.g. "
                          f"{out / 'doctor.png'}.")
    _probe_dir(out.parent, f"{flag} directory")
    return out


def write_results(name: str, payload: Mapping[str, Any], settings: Mapping[str, Any],
                  out_dir: str | Path | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` = {name, kind, settings, results, environment}
    (through a temporary file, so an interrupted write never leaves half a file)."""
    _check_name(name)
    out = Path(out_dir) if out_dir is not None else DEFAULT_RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    _check_not_foreign(path)
    doc = {"name": name, "settings": dict(settings), "results": dict(payload),
           "environment": environment()}
    write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    logger.info("wrote %s", path)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory,
    renamed into place: an interrupted write leaves the old file or none, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_acceptance_histogram(histogram: Sequence[int], path: str | Path,
                              title: str = "Accepted draft tokens per verify step") -> Path:
    """Bar chart: verify steps that accepted j draft tokens, j = 0..len-1."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    total = sum(histogram) or 1
    xs = list(range(len(histogram)))
    ax.bar(xs, [h / total for h in histogram], color="#3b75af")
    ax.set_xticks(xs)
    ax.set_xlabel("accepted draft tokens")
    ax.set_ylabel("share of verify steps")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_tokens_per_s_vs_concurrency(series: Mapping[str, Mapping[int, float]], path: str | Path,
                                     title: str = "Output throughput") -> Path:
    """Lines: output tok/s against concurrency, one per server (e.g. spec, baseline)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens / s")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_spec_vs_baseline(labels: Sequence[str], spec: Sequence[float],
                          baseline: Sequence[float | None], path: str | Path,
                          title: str = "Speculative vs target-only") -> Path:
    """Grouped bars of tok/s per label (a concurrency level, or 'offline')."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(range(len(labels)))
    w = 0.38
    ax.bar([x - w / 2 for x in xs], spec, w, label="speculative", color="#3b75af")
    ax.bar([x + w / 2 for x in xs], [b or 0.0 for b in baseline], w, label="target only",
           color="#aaaaaa")
    for x, s, b in zip(xs, spec, baseline):
        if b:
            ax.annotate(f"{s / b:.2f}x", (x, max(s, b)), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(xs, list(labels))
    ax.set_ylabel("output tokens / s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
