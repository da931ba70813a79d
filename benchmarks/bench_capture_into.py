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
MODES = ("eager", "graph")
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


def graphed(fn: Callable[[], object], device: torch.device, calls: int) -> tuple[Callable[[], object], object]:
    """``calls`` calls of ``fn`` captured once into a CUDA graph: (replay, what the last call
    returned, which the replays rewrite). Warmed on a side stream first, as torch asks."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    result = None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            result = fn()
    return graph.replay, result


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int, rep: int,
            mode: str = "eager") -> tuple[float, object]:
    """(median milliseconds per call over ``rep`` timed batches of calls, the last result).

    mode "eager": the calls are launched from Python one after another, so at launch-bound
    sizes the time is the host's. mode "graph" (CUDA only): the same batch of calls is
    captured into a CUDA graph and replayed, as SGLang runs its decode steps: device time
    alone, with the launches already made."""
    if mode not in MODES or (mode == "graph" and device.type != "cuda"):
        raise ValueError(f"mode {mode!r} on {device.type}: expected one of {MODES}, graph on CUDA only")
    for _ in range(warmup):
        fn()
    _sync(device)
    # Calls per batch: enough that a batch lasts ~2 ms on GPU (launch-bound sizes).
    start = time.perf_counter()
    result = fn()
    _sync(device)
    single = max(time.perf_counter() - start, 1e-6)
    inner = 1 if device.type != "cuda" else max(1, min(200, int(2e-3 / single)))
    batch: Callable[[], object]
    if mode == "graph":
        batch, result = graphed(fn, device, inner)
        for _ in range(warmup):
            batch()
    else:
        def batch() -> object:
            for _ in range(inner):
                out = fn()
            return out
    samples = []
    for _ in range(rep):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            batch()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / inner)
        else:
            t0 = time.perf_counter()
            batch()
            samples.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(samples), result


def copy_bandwidth_gbs(device: torch.device, nbytes: int, warmup: int, rep: int) -> float:
    """Device-to-device copy: bytes read + bytes written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms, _ = time_ms(lambda: dst.copy_(src), device, warmup, rep)
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
        "git": _git_label(),
    }


def _git_label() -> str:
    """The checkout's commit (+dirty), or why there is none (a copied tree without .git)."""
    from eagle3_backend.verify.report import git_revision

    rev = git_revision(ROOT)
    if rev["commit"] is None:
        return "unknown (not a git checkout)"
    return rev["commit"][:12] + ("+dirty" if rev["dirty"] else "")


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


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs and signed zeros included)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))


def modes_for(device: torch.device, requested: list[str]) -> list[str]:
    """The timing modes that run on ``device`` (CUDA graphs need CUDA), in MODES order."""
    if device.type != "cuda" and "graph" in requested:
        print("skipping graph mode: CUDA graphs need a CUDA device", file=sys.stderr)
    return [m for m in MODES if m in requested and (m == "eager" or device.type == "cuda")]


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
    modes = modes_for(device, args.modes)
    for n in args.n:                                  # one set of inputs for every mode
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
        for name in providers:
            if not same_bits(calls[name](), expected):
                raise SystemExit(f"{name} differs from torch at N={n}: refusing to time a wrong kernel")
        for mode in modes:
            base_ms = None
            for name in providers:
                out.zero_()
                packer.buffer.zero_()
                ms, result = time_ms(calls[name], device, args.warmup, args.rep, mode)
                if not same_bits(result, expected):       # what the timed calls (or replays) wrote
                    raise SystemExit(f"{name} differs from torch at N={n} in {mode} mode")
                base_ms = ms if name == "torch" else base_ms
                gbs = useful_bytes / (ms * 1e-3) / 1e9
                row = {
                    "mode": mode, "provider": name, "N": n, "K": args.k, "H": args.hidden,
                    "dtype": args.dtype, "time_us": round(ms * 1e3, 3), "GBps": round(gbs, 2),
                    "frac_of_copy": round(gbs / copy_gbs, 4),
                    "speedup_vs_torch": round(base_ms / ms, 3) if base_ms else "",
                    "copy_GBps": round(copy_gbs, 2),
                }
                rows_out.append(row)
                speedup = f"x{base_ms / ms:.2f} vs torch" if base_ms else ""
                print(f"{mode:<5} N={n:>5} {name:<12} {row['time_us']:>10.2f} us {gbs:>9.1f} GB/s "
                      f"{100 * gbs / copy_gbs:>6.1f}% of copy  {speedup}")
    rows_out.sort(key=lambda r: modes.index(r["mode"]))   # the file: one mode after the other
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
        modes = list(dict.fromkeys(r.get("mode", "eager") for r in rows)) or ["eager"]
        fig, axes = plt.subplots(1, len(modes), figsize=(7 * len(modes), 4.5), sharey=True, squeeze=False)
        first = rows[0] if rows else {}
        for ax, mode in zip(axes[0], modes):
            mine = [r for r in rows if r.get("mode", "eager") == mode]
            for name in dict.fromkeys(r["provider"] for r in mine):
                pts = [(r["N"], r["GBps"]) for r in mine if r["provider"] == name]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            ax.axhline(copy_gbs, color="gray", linestyle="--", label=f"d2d copy {copy_gbs:.0f} GB/s")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (rows captured)")
            ax.set_ylabel("GB/s (read + write)")
            how = "replayed from a CUDA graph" if mode == "graph" else "launched from Python"
            ax.set_title(f"capture_into K={first.get('K')} H={first.get('H')} {first.get('dtype')}, {how}\n"
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
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="eager: launched from Python; graph: replayed from a CUDA graph (CUDA only)")
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
