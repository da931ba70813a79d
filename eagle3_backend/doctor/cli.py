"""``eagle3 doctor``: the command line (flags, the looks over more prompts, exit codes)."""

from __future__ import annotations

import shlex
from typing import Any

from eagle3_backend.doctor.verdict import EXIT_CODES, INCONCLUSIVE, MARGIN
from eagle3_backend.errors import Eagle3Error

MAX_PROMPTS = 64   # the default budget: prompts scored at most while the verdict is unsettled


def add_doctor_parser(subparsers: Any) -> Any:
    from eagle3_backend.verify.datasets import FILE_HELP
    from eagle3_backend.verify.targets import allow_pickle_help

    p = subparsers.add_parser(
        "doctor", help="find train/serve wiring mismatches: which hidden states the draft fits",
        description="Run the target on real prompts capturing every layer's input, then score "
                    "the draft's first step (top-1 vs the target's greedy token) under its "
                    "recorded layout, the plausible miswirings of it (off-by-one layer ids, "
                    "another fc order, embed vs layer_input:1, engine defaults) and a coordinate "
                    "search moving each fc slot over the target's layers. While no verdict is "
                    "settled it scores more prompts (--limit, then doubling up to --max-prompts). "
                    f"Exit 0 when no layout tried can fit better than the recorded one by "
                    f"{MARGIN} top-1, 1 when another fits clearly better (MISMATCH) or none fits "
                    f"(WEAK), {EXIT_CODES[INCONCLUSIVE]} when the budget is spent undecided "
                    "(INCONCLUSIVE: the command that settles it is printed), 2 on bad input. "
                    "With --url it also sends the prompts to a live server and "
                    "compares its acceptance length with the offline verifier's (a server "
                    "without the plugin, or serving another draft or target, accepts less).")
    p.add_argument("draft", metavar="DRAFT", help="draft checkpoint directory (any supported format)")
    p.add_argument("--target", default="bundled",
                   help="HF model dir or .gguf file (default: the bundled SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--dataset", default="mt-bench",
                   help=f"mt-bench | sharegpt | {FILE_HELP} (default mt-bench)")
    p.add_argument("--limit", type=int, default=8,
                   help="prompts scored first, and sent to --url (default 8)")
    p.add_argument("--max-prompts", type=int, default=MAX_PROMPTS,
                   help="the budget: while the verdict is unsettled, score more prompts (twice as "
                        f"many each time) up to this many, at least --limit (default {MAX_PROMPTS})")
    p.add_argument("--no-search", action="store_true",
                   help="score only the fixed candidates, not the coordinate search over layers")
    p.add_argument("--max-new-tokens", type=int, default=48,
                   help="greedy answer tokens per prompt to score on (default 48)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="target dtype (default float32)")
    p.add_argument("--device", default=None, help="cpu | cuda[:i] (default: cuda if available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-chat-template", action="store_true",
                   help="encode the raw user text (default: the target tokenizer's chat template)")
    p.add_argument("--url", default=None, metavar="URL",
                   help="also check a live SGLang server (e.g. http://127.0.0.1:30000) serving this "
                        "draft on this target: its acceptance length on the same prompts must match "
                        "the offline verifier's with the server's own settings")
    p.add_argument("--serve-only", action="store_true",
                   help="with --url: skip the layout scoring, only compare served vs offline")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds each request to --url may take (default 300)")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--plot", metavar="PNG", default=None, help="also draw the scores as a bar chart")
    p.add_argument("--allow-pickle", action="store_true", help=allow_pickle_help(True))
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_doctor)
    return p


def run_doctor(args: Any) -> int:
    import json

    from eagle3_backend.verify.datasets import load_prompts
    from eagle3_backend.verify.targets import load_target, resolve_device, set_threads

    if args.limit < 1 or args.max_new_tokens < 1:
        raise Eagle3Error(f"--limit ({args.limit}) and --max-new-tokens ({args.max_new_tokens}) "
                          "must be >= 1.")
    if args.serve_only and not args.url:
        raise Eagle3Error("--serve-only needs --url URL: the live server to check.")
    if not args.timeout > 0:
        raise Eagle3Error(f"--timeout must be > 0 seconds, got {args.timeout}.")
    if args.plot:
        from eagle3_backend.verify.report import check_plot_path

        check_plot_path(args.plot)  # before the run, not after it
    if args.url:  # before the offline run: a wrong --url is found in a second, not after it
        from eagle3_backend.verify.bench import check_reachable

        check_reachable(args.url, "--url", min(10.0, args.timeout))
    set_threads(args.threads)
    device = resolve_device(args.device)
    budget = args.limit if args.serve_only else max(args.limit, args.max_prompts)
    prompts = load_prompts(args.dataset, limit=budget)  # a wrong --dataset before the target
    target = load_target(args.target, dtype=args.dtype, device=device,
                         allow_pickle=args.allow_pickle, progress=not args.no_progress)
    from eagle3_backend.checkpoint import load_draft
    from eagle3_backend.target import TargetInfo

    # a wrong DRAFT (a target dir, a mismatched checkpoint) is reported now, not after the
    # run; read once, used by both checks below
    loaded = load_draft(args.draft, target=TargetInfo.from_path(target.path))
    run = {"dataset": args.dataset, "max_new_tokens": args.max_new_tokens,
           "chat_template": not args.no_chat_template, "max_prompts": budget}
    report = serve = None
    if not args.serve_only:
        from eagle3_backend.doctor.diagnose import diagnose
        from eagle3_backend.doctor.scoring import collect_states

        def states(chunk: list[Any]) -> list[Any]:
            return collect_states(target, chunk, max_new_tokens=args.max_new_tokens,
                                  chat_template=not args.no_chat_template,
                                  progress=not args.no_progress)

        ends = [min(args.limit, len(prompts))]
        while ends[-1] < len(prompts):
            ends.append(min(2 * ends[-1], len(prompts)))
        more = (states(prompts[a:b]) for a, b in zip(ends, ends[1:]))
        report = diagnose(args.draft, target, states(prompts[:ends[0]]), loaded=loaded, more=more,
                          search=not args.no_search)
        report.extra.update(run)
        if report.verdict == INCONCLUSIVE:
            report.message += " " + _settle(args, report.extra["prompts_to_settle"],
                                            report.prompts, len(prompts), len(prompts) < budget)
    if args.url:
        from eagle3_backend.doctor.serve import check_server

        serve = check_server(args.url, args.draft, target, prompts[:args.limit],
                             max_new_tokens=args.max_new_tokens,
                             chat_template=not args.no_chat_template, timeout_s=args.timeout,
                             progress=not args.no_progress, loaded=loaded)
    if args.json:
        out = report.as_dict() if report is not None else {"draft": str(args.draft),
                                                             "target": str(target.path), **run}
        if serve is not None:
            out["serve"] = serve.as_dict()
        print(json.dumps(out, indent=2))
    else:
        from eagle3_backend.doctor.report import format_report, format_serve_report

        parts = ([format_report(report)] if report is not None else []) + (
            [format_serve_report(serve)] if serve is not None else [])
        print("\n\n".join(parts))
    if args.plot:  # after the report is printed: a failure here loses nothing
        from eagle3_backend.doctor.plot import plot_scores

        plot_scores(report, args.plot, serve)
    codes = {EXIT_CODES[r.verdict] for r in (report, serve) if r is not None}
    return 1 if 1 in codes else max(codes)


def _settle(args: Any, needed: int, scored: int, available: int, exhausted: bool) -> str:
    """The command that settles an INCONCLUSIVE verdict: the same run with a larger budget."""
    want = -(-max(needed, 2 * scored) // 8) * 8
    argv = ["eagle3", "doctor", str(args.draft)]
    for flag, value, default in (("--target", args.target, "bundled"),
                                 ("--dataset", "sharegpt" if exhausted else args.dataset, "mt-bench"),
                                 ("--limit", args.limit, 8), ("--max-new-tokens", args.max_new_tokens, 48),
                                 ("--dtype", args.dtype, "float32"), ("--device", args.device, None),
                                 ("--threads", args.threads, None)):
        if value != default:
            argv += [flag, str(value)]
    argv += ["--max-prompts", str(want)]
    argv += [f for f, on in (("--no-chat-template", args.no_chat_template),
                             ("--allow-pickle", args.allow_pickle)) if on]
    where = (f"{args.dataset} has only {available} prompts, so take them from a larger "
             f"dataset: " if exhausted else "")
    return (f"About {needed} prompts would settle it at this gap; {where}"
            f"run {shlex.join(argv)}")
