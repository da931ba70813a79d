"""Benchmark: building the draft fc input [N, K*H] at capture time from K layers.

Each captured layer input is ``hidden + residual`` [N, H]; the fc input is the K
of them side by side. Providers (each checked bit for bit against "torch" before
it is timed):
  torch        K sums + torch.cat (SGLang's AuxHiddenStateList path)
  sglang_pack  SGLang's AuxHiddenStatePacker semantics, implemented here (no
               sglang import): each sum copied into slot k of a preallocated
               [N, K*H] buffer
  triton       K eagle3_backend.ops.capture_into(backend="triton") calls
  cuda         K eagle3_backend.ops.capture_into(backend="cuda") calls (csrc/; built
               on the fly with torch.utils.cpp_extension if setup.py was not run)

Reports time, GB/s of the op's useful traffic (2*N*K*H*itemsize read + N*K*H*itemsize
written) and that as a fraction of the device-to-device copy bandwidth measured in the
same run. Writes CSV (+ PNG if matplotlib is present) to benchmarks/results/.

GPU:   python benchmarks/bench_capture_into.py
CPU smoke (tests): TRITON_INTERPRET=1 python benchmarks/bench_capture_into.py \
           --device cpu --n 1 4 --hidden 64 --rep 2 --warmup 1
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from eagle3_backend.ops import _ext, capture_into  # noqa: E402

DEFAULT_N = (1, 4, 16, 64, 256, 1024, 4096, 8192)
PROVIDERS = ("torch", "sglang_pack", "triton", "cuda")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ---- the baselines -------------------------------------------------------------------------


def torch_sum_cat(hiddens: list[torch.Tensor], residuals: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([h + r for h, r in zip(hiddens, residuals)], dim=1)  # [N, K*H]


class PackEachCapture:
    """AuxHiddenStatePacker semantics: each capture's sum is copied into slot k of a
    preallocated [N, K*H] buffer as the target runs."""

    def __init__(self, rows: int, width: int, k: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buffer = torch.empty(rows, k * width, dtype=dtype, device=device)  # [N, K*H]
        self.width = width

    def __call__(self, hiddens: list[torch.Tensor], residuals: list[torch.Tensor]) -> torch.Tensor:
        for k, (h, r) in enumerate(zip(hiddens, residuals)):
            self.buffer[:, k * self.width : (k + 1) * self.width].copy_(h + r)
        return self.buffer


def capture_all(buffer: torch.Tensor, hiddens: list[torch.Tensor], residuals: list[torch.Tensor],
                backend: str) -> torch.Tensor:
    for slot, (h, r) in enumerate(zip(hiddens, residuals)):
        capture_into(buffer, slot, h, r, backend=backend)
    return buffer


# ---- timing --------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int, rep: int) -> float:
    """Median milliseconds per call over ``rep`` timed batches of calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    # Calls per batch: enough that a batch lasts ~2 ms on GPU (launch-bound sizes).
    start = time.perf_counter()
    fn()
    _sync(device)
    single = max(time.perf_counter() - start, 1e-6)
    inner = 1 if device.type != "cuda" else max(1, min(200, int(2e-3 / single)))
    samples = []
    for _ in range(rep):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(samples)


def copy_bandwidth_gbs(device: torch.device, nbytes: int, warmup: int, rep: int) -> float:
    """Device-to-device copy: bytes read + bytes written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, warmup, rep)
    return 2 * nbytes / (ms * 1e-3) / 1e9


# ---- environment ---------------------------------------------------------------------------


def _nvcc_version() -> str:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "none"
    return out.strip().splitlines()[-1] if out.strip() else "none"


def environment(device: torch.device, argv: list[str], script: str = "bench_capture_into.py") -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "device": gpu,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "triton": triton_version,
        "nvcc": _nvcc_version(),
        "python": platform.python_version(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": f"python benchmarks/{script} " + " ".join(shlex.quote(a) for a in argv),
    }


def available_providers(requested: list[str], device: torch.device, jit: bool) -> tuple[list[str], dict[str, str]]:
    keep, skipped = [], {}
    for name in requested:
        if name == "cuda":
            if device.type != "cuda":
                skipped[name] = "needs a CUDA device"
                continue
            if not _ext.available() and not (jit and _ext.jit_build(verbose=False)):
                skipped[name] = f"extension unavailable: {_ext.load_error()}"
                continue
        if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            skipped[name] = "CPU tensors need TRITON_INTERPRET=1"
            continue
        keep.append(name)
    return keep, skipped


# ---- main ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    providers, skipped = available_providers(args.providers, device, jit=not args.no_jit)
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", file=sys.stderr)
    env = environment(device, args.argv)
    copy_gbs = copy_bandwidth_gbs(device, args.copy_mib << 20, args.warmup, args.rep)
    print(f"# {env['device']} | torch {env['torch']} | triton {env['triton']} | copy {copy_gbs:.1f} GB/s")

    generator = torch.Generator().manual_seed(0)
    rows_out = []
    for n in args.n:
        def states() -> list[torch.Tensor]:
            return [torch.randn(n, args.hidden, generator=generator).to(dtype).to(device) for _ in range(args.k)]

        hiddens, residuals = states(), states()
        useful_bytes = 3 * n * args.k * args.hidden * hiddens[0].element_size()
        out = torch.empty(n, args.k * args.hidden, dtype=dtype, device=device)
        packer = PackEachCapture(n, args.hidden, args.k, dtype, device)
        calls: dict[str, Callable[[], object]] = {
            "torch": lambda: torch_sum_cat(hiddens, residuals),
            "sglang_pack": lambda: packer(hiddens, residuals),
            "triton": lambda: capture_all(out, hiddens, residuals, "triton"),
            "cuda": lambda: capture_all(out, hiddens, residuals, "cuda"),
        }
        expected = torch_sum_cat(hiddens, residuals)
        base_ms = None
        for name in providers:
            result = calls[name]()
            if not torch.equal(result.view(torch.int16 if result.element_size() == 2 else torch.int32),
                               expected.view(torch.int16 if expected.element_size() == 2 else torch.int32)):
                raise SystemExit(f"{name} differs from torch at N={n}: refusing to time a wrong kernel")
            ms = time_ms(calls[name], device, args.warmup, args.rep)
            base_ms = ms if name == "torch" else base_ms
            gbs = useful_bytes / (ms * 1e-3) / 1e9
            row = {
                "provider": name, "N": n, "K": args.k, "H": args.hidden, "dtype": args.dtype,
                "time_us": round(ms * 1e3, 3), "GBps": round(gbs, 2),
                "frac_of_copy": round(gbs / copy_gbs, 4),
                "speedup_vs_torch": round(base_ms / ms, 3) if base_ms else "",
                "copy_GBps": round(copy_gbs, 2),
            }
            rows_out.append(row)
            speedup = f"x{base_ms / ms:.2f} vs torch" if base_ms else ""
            print(f"N={n:>5} {name:<12} {row['time_us']:>10.2f} us {gbs:>9.1f} GB/s "
                  f"{100 * gbs / copy_gbs:>6.1f}% of copy  {speedup}")
    write_results(rows_out, env, copy_gbs, Path(args.out_dir), args.tag, plot=not args.no_plot)
    return rows_out


def write_csv(rows: list[dict[str, object]], header: dict[str, str], out_dir: Path, stem: str,
              tag: str | None) -> Path:
    """``<out_dir>/<stem>_<tag or device>.csv``: ``# key: value`` header lines, then the rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = tag or "".join(c if c.isalnum() else "_" for c in header["device"]).strip("_").lower()
    path = out_dir / f"{stem}_{slug}.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        fh.writelines(f"# {key}: {value}\n" for key, value in header.items())
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["provider"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    return path


def write_results(rows: list[dict[str, object]], env: dict[str, str], copy_gbs: float, out_dir: Path,
                  tag: str | None, plot: bool) -> Path:
    csv_path = write_csv(rows, {**env, "copy_GBps": f"{copy_gbs:.2f}"}, out_dir, "capture_into", tag)
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot", file=sys.stderr)
            return csv_path
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name in dict.fromkeys(r["provider"] for r in rows):
            pts = [(r["N"], r["GBps"]) for r in rows if r["provider"] == name]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.axhline(copy_gbs, color="gray", linestyle="--", label=f"d2d copy {copy_gbs:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (rows captured)")
        ax.set_ylabel("GB/s (read + write)")
        first = rows[0] if rows else {}
        ax.set_title(f"capture_into K={first.get('K')} H={first.get('H')} {first.get('dtype')}\n"
                     f"{env['device']} | torch {env['torch']} | triton {env['triton']}", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        png = csv_path.with_suffix(".png")
        fig.savefig(png, dpi=120)
        plt.close(fig)
        print(f"wrote {png}")
    return csv_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, nargs="+", default=list(DEFAULT_N))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--copy-mib", type=int, default=1024, help="size of the copy-bandwidth probe")
    parser.add_argument("--no-plot", action="store_true")
    return parse_common(parser, PROVIDERS, argv)


def parse_common(parser: argparse.ArgumentParser, providers: tuple[str, ...],
                 argv: list[str] | None) -> argparse.Namespace:
    """The options every ops benchmark takes, then parse; ``args.argv`` is the command line."""
    parser.add_argument("--providers", nargs="+", choices=providers, default=list(providers))
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rep", type=int, default=30)
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", default=None, help="file name suffix (default: the device name)")
    parser.add_argument("--no-jit", action="store_true", help="do not JIT-build the CUDA extension")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


if __name__ == "__main__":
    run(parse_args())
