"""``eagle3 eval`` and ``eagle3 bench``: argument parsing and printing.

Wired into :mod:`eagle3_backend.cli` with::

    add_eval_parser(sub); add_bench_parser(sub)      # in build_parser()
    # dispatch: args.func(args) -> exit code

Each ``add_*_parser`` sets ``func`` on its subparser (``run_eval`` / ``run_bench``),
which returns an exit code (0 ok; 1 the run completed but with a problem:
outputs differ at temperature 0, or requests failed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.verify.datasets import FILE_HELP

logger = logging.getLogger(__name__)

__all__ = ["add_bench_parser", "add_eval_parser", "run_bench", "run_eval"]

EXIT_OK, EXIT_PROBLEMS = 0, 1


def _spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative settings (SGLang names)")
    g.add_argument("--speculative-num-steps", type=int, default=3, metavar="N",
                   help="draft depth: draft forwards per verify step (default 3)")
    g.add_argument("--speculative-eagle-topk", type=int, default=1, metavar="K",
                   help="branching per draft step; 1 = chain (default 1)")
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None, metavar="N",
                   help="tokens verified per step, root included (default: steps+1 for a "
                        "chain, min(8, all scored nodes + 1) for a tree)")


def _dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="mt-bench",
                   help=f"mt-bench | sharegpt | {FILE_HELP} (default mt-bench)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="M",
                   help="new tokens per prompt (default 128)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); > 0 samples")


def _output_args(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--output-dir", default=None, metavar="DIR",
                   help="write DIR/NAME.json (machine, versions, settings, git revision) and PNG "
                        "plots (default with --name: benchmarks/results)")
    p.add_argument("--name", default=None,
                   help=f"results file stem (default {kind}-<dataset>-<settings>-<time>); "
                        "giving it writes the results file")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


# --------------------------------------------------------------------------- eval
def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    from eagle3_backend.verify.targets import allow_pickle_help

    p = subparsers.add_parser(
        "eval", help="offline: acceptance length and tok/s of a draft vs the target alone",
        description="Run the target alone and target + draft (speculative) on the same prompts "
                    "in this process; report acceptance length, per-position acceptance, tok/s, "
                    "speedup and whether greedy outputs are identical.")
    p.add_argument("--target", default="bundled",
                   help="HF model dir or .gguf file (default: the bundled SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--draft", required=True, help="draft checkpoint directory (any supported format)")
    _dataset_args(p)
    _spec_args(p)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="target and draft dtype (default float32: greedy outputs must be identical)")
    p.add_argument("--device", default=None, help="cpu | cuda[:i] (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-baseline", action="store_true", help="skip the target-only run")
    p.add_argument("--turn", type=int, default=1, metavar="N",
                   help="evaluate the Nth user turn: the target first answers the turns before "
                        "it greedily (--max-new-tokens each) and its answers stay in the chat, "
                        "as a chat client sends them; prompts with fewer turns are skipped "
                        "(MT-Bench has 2; default 1)")
    p.add_argument("--allow-pickle", action="store_true", help=allow_pickle_help(True))
    p.add_argument("--no-chat-template", action="store_true",
                   help="encode the raw user text (default: the target tokenizer's chat template)")
    _output_args(p, "eval")
    p.set_defaults(func=run_eval)
    return p


def _default_name(kind: str, dataset: str, extra: str) -> str:
    name = Path(dataset).name
    stem = Path(name[:-3] if name.lower().endswith(".gz") else name).stem
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)
    return f"{kind}-{safe}-{extra}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_eval(args: argparse.Namespace) -> int:
    from eagle3_backend.checkpoint.files import checkpoint_dir, read_config
    from eagle3_backend.verify.datasets import load_prompts
    from eagle3_backend.verify.engine import load_draft_model
    from eagle3_backend.verify.evaluate import at_turn, evaluate
    from eagle3_backend.verify.targets import load_target, parse_dtype, resolve_device, set_threads
    from eagle3_backend.verify.tree import SpecSettings

    if not args.temperature >= 0:
        raise Eagle3Error(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}.")
    set_threads(args.threads)
    device = resolve_device(args.device)
    settings = SpecSettings(args.speculative_num_steps, args.speculative_eagle_topk,
                            args.speculative_num_draft_tokens)
    if args.max_new_tokens < 1:
        raise Eagle3Error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}.")
    if args.turn < 1:
        raise Eagle3Error(f"--turn {args.turn}: turns count from 1 (the first user turn); "
                          "expected --turn 1 or more.")
    if args.turn > 1 and args.no_chat_template:
        raise Eagle3Error(f"--turn {args.turn}: a later turn is asked as a chat, through the chat "
                          "template; drop --no-chat-template.")
    files_at = _eval_files_at(args, settings) if args.output_dir or args.name else None
    prompts = load_prompts(args.dataset, args.limit)
    read_config(checkpoint_dir(args.draft))  # a wrong --draft is named before the target loads
    dtype = parse_dtype(args.dtype)
    target = load_target(args.target, dtype, device, allow_pickle=args.allow_pickle,
                         progress=not args.no_progress)
    draft = load_draft_model(args.draft, target, device=device, dtype=dtype)
    prompts, skipped = at_turn(target, prompts, args.turn, args.max_new_tokens,
                               progress=not args.no_progress)
    result = evaluate(target, draft, prompts, settings, args.max_new_tokens, args.temperature,
                      args.seed, baseline=not args.no_baseline,
                      chat_template=not args.no_chat_template, progress=not args.no_progress)
    result["target"] = target.path
    result["draft"] = str(args.draft)
    result["dataset"] = args.dataset
    result["turn"] = args.turn
    result["prompts_without_turn"] = skipped
    result["device"] = str(device)
    failed = _try_write(result, lambda: _write_eval_files(args, settings, result, *files_at)
                        if files_at is not None else None)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_eval(result)
    if failed is not None:
        raise failed
    return EXIT_PROBLEMS if result["outputs_identical"] is False and args.dtype == "float32" else EXIT_OK


def _eval_files_at(args: argparse.Namespace, settings: Any) -> tuple[str, Path]:
    """(results name, directory), checked writable before the run."""
    from eagle3_backend.verify.report import check_output_dir

    s = settings.to_dict()
    name = args.name or _default_name(
        "eval", args.dataset, f"s{s['speculative_num_steps']}k{s['speculative_eagle_topk']}"
                              f"n{s['speculative_num_draft_tokens']}-{args.dtype}")
    return name, check_output_dir(name, args.output_dir)


def _write_eval_files(args: argparse.Namespace, settings: Any, result: dict[str, Any],
                      name: str, out: Path) -> list[str]:
    from eagle3_backend.verify.report import (
        plot_acceptance_histogram,
        plot_spec_vs_baseline,
        write_results,
    )

    s = settings.to_dict()
    run_settings = s | {k: getattr(args, k) for k in (
        "draft", "dataset", "limit", "max_new_tokens", "temperature", "dtype", "seed")}
    run_settings["target"] = result["target"]
    run_settings["device"] = result["device"]
    files = [str(write_results(name, result, run_settings, out))]
    files.append(str(plot_acceptance_histogram(result["acceptance_histogram"],
                                               out / f"{name}-acceptance.png")))
    if result.get("baseline_tokens_per_s"):
        files.append(str(plot_spec_vs_baseline(["offline"], [result["tokens_per_s"]],
                                               [result["baseline_tokens_per_s"]],
                                               out / f"{name}-speedup.png")))
    return files


def _try_write(result: dict[str, Any], write: Any) -> Eagle3Error | None:
    """Write the results files; on failure (a full disk) keep the error for after the
    results are printed, so a finished run is never lost to its files."""
    try:
        files = write()
    except OSError as exc:
        return Eagle3Error(f"the run finished (results above) but writing its files failed: "
                           f"{exc.strerror or exc} ({exc.filename or 'no file name'}). Free space "
                           "or choose another --output-dir, and rerun to save them.")
    if files is not None:
        result["files"] = files
    return None


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _by_category(cats: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{name} {_fmt(c['acceptance_length'])}" for name, c in cats.items())


def _print_eval(r: dict[str, Any]) -> None:
    rates = ", ".join(_fmt(x) for x in r["acceptance_rate_by_position"])
    turn = (f", turn {r['turn']} ({r['prompts_without_turn']} without it skipped)"
            if r.get("turn", 1) > 1 else "")
    print(f"prompts               {r['n_prompts']}  ({r['dataset']}{turn}, {r['max_new_tokens']} new"
          f" tokens, temperature {r['temperature']:g}, {r['dtype']}, {r['device']})")
    print(f"settings              {r['settings']}")
    print(f"acceptance length     {_fmt(r['acceptance_length'])} tokens / verify step "
          f"({r['completion_tokens']} tokens, {r['verify_steps']} steps)")
    print(f"acceptance by position {rates}")
    print(f"histogram (accepted)  {r['acceptance_histogram']}")
    if r.get("acceptance_by_category"):
        print(f"by category           {_by_category(r['acceptance_by_category'])}")
    print(f"tok/s speculative     {_fmt(r['tokens_per_s'])}")
    print(f"tok/s target only     {_fmt(r['baseline_tokens_per_s'])}")
    print("speedup               " + (f"{r['speedup']:.2f}x" if r["speedup"] is not None
                                       else "n/a (no target-only run)"))
    ms = r.get("step_ms") or {}
    if ms.get("step") is not None:
        cost = (f" = {_fmt(ms['step_cost'])} decode steps of {_fmt(ms['decode'], '.1f')} ms"
                if ms.get("step_cost") is not None else "")
        print(f"verify step           {_fmt(ms['step'], '.1f')} ms: draft {_fmt(ms['draft'], '.1f')}"
              f", target forward {_fmt(ms['verify'], '.1f')}, accept {_fmt(ms['accept'], '.1f')}"
              f"{cost}")
    if r["outputs_identical"] is not None:
        why = ("; expected in reduced precision: a k-token verify and a 1-token decode round "
               "differently, so a near-tie can fall the other way (identical is checked in "
               "float32)" if r["outputs_identical"] is False and r["dtype"] != "float32" else "")
        print(f"outputs identical     {r['outputs_identical']} "
              f"(agreement {_fmt(r['agreement_rate'], '.0%')} of prompts{why})")
    for f in r.get("files", []):
        print(f"wrote                 {f}")


# --------------------------------------------------------------------------- bench
def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="live servers: acceptance length and tok/s per concurrency level",
        description="Send the dataset's prompts to a running SGLang server (and optionally a "
                    "target-only baseline server) at each concurrency level; report acceptance "
                    "length (meta_info.spec_accept_length / spec_verify_ct, /server_info "
                    "avg_spec_accept_length), output tok/s and speedup. Failed requests are "
                    "reported one by one; each request has a hard timeout.")
    p.add_argument("--url", required=True, help="speculative server, e.g. http://127.0.0.1:30000")
    p.add_argument("--baseline-url", default=None, help="target-only server for the speedup")
    _dataset_args(p)
    p.add_argument("--concurrency", default="1,4,16",
                   help="comma-separated concurrency levels (default 1,4,16)")
    p.add_argument("--api", default="native", choices=("native", "openai"),
                   help="native /generate (default) or OpenAI /v1/chat/completions")
    p.add_argument("--tokenizer", default=None, metavar="TARGET",
                   help="native API: apply this target's chat template (HF dir or .gguf) before "
                        "sending; without it the raw user text is sent")
    p.add_argument("--model", default="default", help="OpenAI 'model' field (default 'default')")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="per-request deadline in seconds (default 300)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests per server (default 1)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens")
    _output_args(p, "bench")
    p.set_defaults(func=run_bench)
    return p


def _parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise Eagle3Error(f"--concurrency must be positive integers separated by commas, got {text!r}.")
    return levels


def _bench_prompts(args: argparse.Namespace, prompts: list[Any], tok: Any) -> list[Any]:
    if args.api == "openai":
        return [p.as_chat() for p in prompts]
    if tok is None:
        print("eagle3 bench: note: native API without --tokenizer sends the raw user text (no "
              "chat template); acceptance will not reflect chat-formatted serving. Pass "
              "--tokenizer TARGET or --api openai.", file=sys.stderr)
        return [p.text for p in prompts]
    return [tok.apply_chat_template(p.as_chat(), add_generation_prompt=True, tokenize=False)
            for p in prompts]


def run_bench(args: argparse.Namespace) -> int:
    from eagle3_backend.verify.bench import (BenchSettings, NotSGLangError, check_reachable,
                                             fetch_server_info, run_benchmark)
    from eagle3_backend.verify.datasets import load_prompts

    levels = _parse_levels(args.concurrency)
    if args.warmup < 0:
        raise Eagle3Error(f"--warmup must be >= 0 requests, got {args.warmup}.")
    settings = BenchSettings(api=args.api, max_new_tokens=args.max_new_tokens,
                             temperature=args.temperature, timeout_s=args.timeout,
                             model=args.model, ignore_eos=args.ignore_eos)
    files_at = _bench_files_at(args) if args.output_dir or args.name else None
    prompts = load_prompts(args.dataset, args.limit)
    tokenizer = None  # read and checked before the servers are asked anything
    if args.api == "native" and args.tokenizer is not None:
        from eagle3_backend.verify.targets import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    for flag, url in (("--url", args.url), ("--baseline-url", args.baseline_url)):
        if url:
            check_reachable(url, flag, min(10.0, args.timeout))
            if args.api == "native":  # SGLang's own /generate: a server without it is named now
                try:
                    info = fetch_server_info(url, min(10.0, args.timeout))
                    if flag == "--url" and info.get("speculative_algorithm") is None:
                        print(f"eagle3 bench: note: {url} does not speculate (its /server_info "
                              "has no speculative_algorithm): acceptance will be n/a. The EAGLE-3 "
                              "server goes to --url, the target-only one to --baseline-url.",
                              file=sys.stderr)
                except NotSGLangError as exc:
                    raise Eagle3Error(f"{flag} {url}: {exc}: not an SGLang server. Is this the "
                                      "SGLang server's port? (Another OpenAI-compatible server: "
                                      "--api openai.)") from None
                except ValueError:  # slow or busy: the run itself will tell
                    pass
    categories = [p.category for p in prompts]
    prompts = _bench_prompts(args, prompts, tokenizer)
    result = run_benchmark(args.url, prompts, levels, settings, args.baseline_url,
                           warmup=args.warmup, progress=not args.no_progress,
                           categories=categories if any(categories) else None)
    result["dataset"] = args.dataset
    failed = _try_write(result, lambda: _write_bench_files(args, result, *files_at)
                        if files_at is not None else None)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "requests"}, indent=2))
    else:
        _print_bench(result, raw_text=args.api == "native" and args.tokenizer is None)
    if failed is not None:
        raise failed
    return EXIT_PROBLEMS if result["errors"] else EXIT_OK


def _bench_files_at(args: argparse.Namespace) -> tuple[str, Path]:
    """(results name, directory), checked writable before the run."""
    from eagle3_backend.verify.report import check_output_dir

    name = args.name or _default_name("bench", args.dataset, f"{args.api}-c{args.concurrency.replace(',', '-')}")
    return name, check_output_dir(name, args.output_dir)


def _write_bench_files(args: argparse.Namespace, result: dict[str, Any], name: str,
                       out: Path) -> list[str]:
    from eagle3_backend.verify.report import (
        plot_acceptance_histogram,
        plot_spec_vs_baseline,
        plot_tokens_per_s_vs_concurrency,
        write_results,
    )

    files = [str(write_results(name, result, result["settings"] | {"url": args.url,
                                                                    "baseline_url": args.baseline_url,
                                                                    "dataset": args.dataset}, out))]
    levels = result["levels"]
    series = {role: {lv["concurrency"]: lv[role]["output_tokens_per_s"] for lv in levels}
              for role in ("spec", "baseline") if levels and role in levels[0]}
    files.append(str(plot_tokens_per_s_vs_concurrency(series, out / f"{name}-throughput.png")))
    hist: list[int] = []
    for lv in levels:
        for j, c in enumerate(lv["spec"]["acceptance_histogram"] or []):
            hist.extend([0] * (j + 1 - len(hist)))
            hist[j] += c
    if hist:
        files.append(str(plot_acceptance_histogram(hist, out / f"{name}-acceptance.png")))
    if "baseline" in series:
        files.append(str(plot_spec_vs_baseline(
            [f"c={lv['concurrency']}" for lv in levels],
            [lv["spec"]["output_tokens_per_s"] for lv in levels],
            [lv["baseline"]["output_tokens_per_s"] for lv in levels],
            out / f"{name}-speedup.png")))
    return files


def no_spec_lines(result: dict[str, Any], raw_text: bool = False) -> list[str]:
    """One line per level whose speculative server answered requests without speculative
    metrics: how many, which, and that the acceptance length leaves them out."""
    lines = []
    for lv in result["levels"]:
        s = lv["spec"]
        miss = s.get("no_spec_metrics")
        if not miss or not miss["n"]:
            continue
        parts = []
        if miss["finished_in_prefill"]:
            ids = miss["finished_in_prefill"]
            parts.append(f"{len(ids)} finished in the prefill with at most one token, nothing to "
                         f"speculate (requests {_ids(ids)})"
                         + (", e.g. an immediate end of sequence on raw text without a chat "
                            "template: pass --tokenizer TARGET" if raw_text else ""))
        if miss["decoded"]:
            ids = miss["decoded"]
            parts.append(f"{len(ids)} decoded more tokens with no verify step counted, not "
                         f"speculated or the metric lost (requests {_ids(ids)})")
        lines.append(f"c={lv['concurrency']}: {miss['n']} of {s['n_ok']} answers carry no "
                     f"speculative metrics (SGLang counted no verify step), left out of the "
                     f"acceptance length, which is over the other {s['n_spec_measured']}: "
                     + "; ".join(parts))
    return lines


def _ids(ids: list[int], most: int = 20) -> str:
    return ", ".join(map(str, ids[:most])) + (f", ... ({len(ids) - most} more)" if len(ids) > most else "")


def _print_bench(result: dict[str, Any], raw_text: bool = False) -> None:
    for role, info in result["servers"].items():
        extra = info.get("server_info") or {"error": info.get("server_info_error")}
        print(f"{role:9s} {info['url']}  {json.dumps(extra)}")
    print(f"{'conc':>5} {'ok/n':>8} {'tok/s':>9} {'accept':>7} {'srv acc':>7} "
          f"{'base tok/s':>10} {'speedup':>7}")
    for lv in result["levels"]:
        s, b = lv["spec"], lv.get("baseline")
        print(f"{lv['concurrency']:>5} {s['n_ok']:>4}/{s['n_requests']:<3} "
              f"{s['output_tokens_per_s']:>9.1f} {_fmt(s['acceptance_length']):>7} "
              f"{_fmt(s['server_avg_spec_accept_length']):>7} "
              f"{_fmt(b['output_tokens_per_s'], '.1f') if b else 'n/a':>10} "
              f"{_fmt(lv['speedup']):>7}")
    for line in no_spec_lines(result, raw_text):
        print(line)
    for lv in result["levels"]:
        if lv["spec"].get("acceptance_by_category"):
            print(f"c={lv['concurrency']} accept by category: {_by_category(lv['spec']['acceptance_by_category'])}")
    for e in result["errors"][:20]:
        print(f"error: {e['server']} c={e['concurrency']} request {e['index']}: {e['error']}",
              file=sys.stderr)
    if len(result["errors"]) > 20:
        print(f"... and {len(result['errors']) - 20} more errors (see --json)", file=sys.stderr)
    for f in result.get("files", []):
        print(f"wrote {f}")
