"""The ``eagle3`` command: inspect, convert and validate draft checkpoints; show the environment.

    eagle3 inspect CKPT [--json] [--target T]
    eagle3 convert SRC DST --to sglang|speculators [--target T] [--allow-pickle] [--force]
                                             (with --target: exit 1 when DST is not servable)
    eagle3 validate CKPT --target T [--speculative-*]  (exit 0 servable, 1 problems, 2 bad input)
    eagle3 env [--json]
    eagle3 make-demo-draft OUT --target GGUF_OR_DIR [--seed N] [--layout L]
    eagle3 eval --draft D [--target T] --dataset mt-bench|sharegpt|FILE [--json]
    eagle3 bench --url URL [--baseline-url URL] --dataset ... --concurrency 1,4,16
    eagle3 train --out DIR [--target T] [--dataset sharegpt|FILE] [--minutes M]
    eagle3 doctor DRAFT [--target T] [--dataset mt-bench|FILE] [--url URL]   (exit 0 fits, 1 mismatch, 4 undecided)
    eagle3 swap --url URL --draft DIR [--probe-prompts N] [--keep-if-worse]  (exit 0 only when DIR is live)
    eagle3 swap --url URL --rollback

Bad input (a missing file, a malformed config.json, a refused pickle) prints one
paragraph naming the file, the field, the value, what was expected and the fix,
and exits 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from typing import Any, Sequence

from eagle3_backend.errors import Eagle3Error

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


# ----------------------------------------------------------------------------- helpers
def _target(value: str | None):
    if value is None:
        return None
    from eagle3_backend.target import TargetInfo

    return TargetInfo.from_path(value)


def _load(args: argparse.Namespace, strict: bool = True):
    from eagle3_backend.checkpoint import load_draft

    return load_draft(args.ckpt, target=_target(getattr(args, "target", None)),
                      allow_pickle=args.allow_pickle, strict=strict, ids_as=args.ids_as)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def _fmt_int(n: int) -> str:
    return f"{n:,}"


# ----------------------------------------------------------------------------- inspect
def cmd_inspect(args: argparse.Namespace) -> int:
    from eagle3_backend.checkpoint import inspect_report

    loaded = _load(args)
    rep = inspect_report(loaded)
    if args.json:
        _print_json(rep)
        return EXIT_OK
    cfg = loaded.config
    tgt = rep["target"]
    target_txt = (f"{tgt['architecture'] or 'unknown architecture'}, "
                  f"{tgt['num_hidden_layers'] or '?'} layers (as recorded or given by --target)")
    on = [k for k, v in rep["variants"].items() if v and k != "rope_scaling"]
    if cfg.num_hidden_layers > 1:
        on.insert(0, f"{cfg.num_hidden_layers} decoder layers")
    if rep["variants"]["rope_scaling"]:
        on.append(f"rope_scaling={rep['variants']['rope_scaling']['rope_type']}")
    vocab = (f"draft {cfg.draft_vocab_size} of target {cfg.vocab_size} ids (d2t map)"
             if rep["has_d2t"] else f"full target vocabulary {cfg.vocab_size}")
    rows = [
        ("checkpoint", f"{rep['path']}  ({rep['format']} format)"),
        ("layout", str(cfg.layout)),
        ("known from", f"{rep['layout_source']}: {rep['layout_explanation']}"),
        ("target", target_txt),
        ("fc", f"{len(cfg.layout)} x {cfg.target_hidden_size} = {rep['fc_in_features']} -> "
               f"{cfg.hidden_size}"),
        ("vocab", vocab),
        ("embedding", "own embed_tokens" if cfg.has_embed_tokens else "taken from the target"),
        ("dtype", f"{rep['dtype']}, {_fmt_int(rep['num_parameters'])} parameters"),
        ("variants", ", ".join(on) or "none (plain EAGLE-3)"),
    ]
    if rep["sglang_ids"] is not None:
        rows.append(("sglang ids", str(rep["sglang_ids"])))
    for key, value in rows:
        print(f"{key:<11} {value}")
    for w in rep["warnings"]:
        print(f"warning: {w}")
    return EXIT_OK


# ----------------------------------------------------------------------------- convert
def cmd_convert(args: argparse.Namespace) -> int:
    from eagle3_backend.checkpoint import load_draft, save_sglang, save_speculators

    from eagle3_backend.checkpoint.files import check_destination

    target = _target(args.target)
    # before reading the weights: a DST that is (or holds) SRC would lose it
    check_destination(args.dst, args.force, (args.src, args.target))
    loaded = load_draft(args.src, target=target, allow_pickle=args.allow_pickle,
                        ids_as=args.ids_as)
    if args.layout:
        loaded = _relabel_layout(loaded, args.layout)
    save = save_sglang if args.to == "sglang" else save_speculators
    out = save(loaded, args.dst, target=target, force=args.force, sources=(args.src,))
    print(f"wrote {out} ({args.to} format, {loaded.dtype}, layout {loaded.layout}, "
          f"from {loaded.format} {loaded.path}; layout {loaded.layout_source})")
    for w in loaded.warnings:
        print(f"warning: {w}")
    if target is None or args.to != "sglang":
        return EXIT_OK
    from eagle3_backend.checkpoint.suite import judge

    verdict = judge(out, target)  # what `eagle3 validate OUT --target T` says, in its words
    for f in verdict.errors:
        print(f"problem: {f}")
    for note in verdict.notes:  # with what reading OUT warns (stock SGLang ignores a flag ...)
        if note not in loaded.warnings:
            print(f"note: {note}")
    return EXIT_PROBLEMS if verdict.errors else EXIT_OK


def _relabel_layout(loaded: Any, text: str) -> Any:
    """The draft with its fc slots declared to be ``text`` (same fc columns, new labels)."""
    import dataclasses

    from eagle3_backend.errors import LayoutMismatch
    from eagle3_backend.layout import parse_layout_flag

    layout = parse_layout_flag(text, loaded.target_num_layers)
    if len(layout) != len(loaded.layout):
        raise LayoutMismatch(
            f"--layout {layout} has {len(layout)} sources but the draft's fc reads "
            f"{len(loaded.layout)} (recorded {loaded.layout}); give one source per fc slot.")
    return dataclasses.replace(
        loaded, config=dataclasses.replace(loaded.config, layout=layout), layout_source="explicit",
        layout_explanation=f"set by eagle3 convert --layout (was {loaded.layout}, "
                           f"{loaded.layout_source})")


# ----------------------------------------------------------------------------- validate
def cmd_validate(args: argparse.Namespace) -> int:
    from eagle3_backend.checkpoint.suite import LaunchArgs, judge

    target = _target(args.target)
    launch = LaunchArgs(args.speculative_algorithm, str(args.ckpt),
                        num_steps=args.speculative_num_steps, topk=args.speculative_eagle_topk,
                        num_draft_tokens=args.speculative_num_draft_tokens,
                        context_length=args.context_length)
    verdict = judge(args.ckpt, target, args=launch, allow_pickle=args.allow_pickle,
                    ids_as=args.ids_as)
    problems = [str(f) for f in verdict.errors]
    ckpt = verdict.loaded.path if verdict.loaded else str(args.ckpt)
    if args.json:
        _print_json({
            "checkpoint": ckpt, "target": target.source,
            "target_architecture": target.architecture,
            "target_num_hidden_layers": target.num_hidden_layers,
            "target_hidden_size": target.hidden_size, "target_vocab_size": target.vocab_size,
            "layout": verdict.layout.to_strings() if verdict.layout else None,
            "layout_source": verdict.layout_source, "servable": not problems,
            "problems": problems, "notes": verdict.notes})
        return EXIT_PROBLEMS if problems else EXIT_OK
    on = (f"{target.source} ({target.architecture}, {target.num_hidden_layers} layers, hidden "
          f"{target.hidden_size}, vocab {target.vocab_size})")
    if problems:
        print(f"NOT SERVABLE: {ckpt} on {on}: {len(problems)} problem(s)")
    else:
        print(f"OK: {ckpt} can be served on {on}; layout {verdict.layout} "
              f"({verdict.layout_source})")
    for line in [f"  - {p}" for p in problems] + [f"note: {n}" for n in verdict.notes]:
        print(line)
    return EXIT_PROBLEMS if problems else EXIT_OK


# ----------------------------------------------------------------------------- env
def environment() -> dict[str, Any]:
    """Versions (``verify.report``'s package list) and accelerator status, without importing sglang."""
    from eagle3_backend.verify.report import package_version, versions

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "eagle3_backend": package_version(),
        "packages": versions(),
    }
    try:
        import torch

        cuda = torch.cuda.is_available()
        info["cuda"] = {
            "available": cuda,
            "torch_cuda": torch.version.cuda,
            "devices": [
                {"name": torch.cuda.get_device_name(i),
                 "capability": "sm_%d%d" % torch.cuda.get_device_capability(i)}
                for i in range(torch.cuda.device_count())
            ] if cuda else [],
        }
    except Exception as exc:  # a broken torch install is exactly what `env` must show
        info["cuda"] = {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    info["extension"], info["kernels"], info["kernels_error"] = _kernel_status()
    return info


def _kernel_status() -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(extension status, {op: {backend, reason}}, error) from eagle3_backend.ops."""
    try:
        from eagle3_backend import ops
    except Exception as exc:
        why = f"eagle3_backend.ops does not import: {type(exc).__name__}: {exc}"
        return {"loaded": False, "error": why}, {}, why
    results: list[Any] = []
    errors: list[str] = []
    for name in ("extension_status", "describe_backends"):
        fn = getattr(ops, name, None)
        if fn is None:
            results.append(None)
            errors.append(f"eagle3_backend.ops.{name}() is not available")
            continue
        try:
            results.append(fn())
        except Exception as exc:
            results.append(None)
            errors.append(f"eagle3_backend.ops.{name}(): {type(exc).__name__}: {exc}")
    ext = results[0] if isinstance(results[0], dict) else {"loaded": False,
                                                            "error": "; ".join(errors)}
    kernels = results[1] if isinstance(results[1], dict) else {}
    return ext, kernels, ("; ".join(errors) or None)


def cmd_env(args: argparse.Namespace) -> int:
    info = environment()
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(f"python          {info['python']} ({info['platform']})")
    print(f"eagle3_backend  {info['eagle3_backend']}")
    for name, version in info["packages"].items():
        print(f"{name:<15} {version or 'not installed'}")
    cuda = info["cuda"]
    if cuda.get("error"):
        print(f"cuda            unknown ({cuda['error']})")
    elif cuda["available"]:
        devs = ", ".join(f"{d['name']} ({d['capability']})" for d in cuda["devices"])
        print(f"cuda            available (torch CUDA {cuda['torch_cuda']}): {devs}")
    else:
        print(f"cuda            not available (torch CUDA build: {cuda['torch_cuda'] or 'none'})")
    ext = info["extension"]
    if ext.get("loaded"):
        print(f"extension       loaded ({ext.get('origin')})")
    else:
        print(f"extension       not loaded: {ext.get('error')}")
    if info["kernels_error"]:
        print(f"kernels         {info['kernels_error']}")
    for op, how in info["kernels"].items():
        if isinstance(how, dict):
            print(f"kernel          {op:<20} {how.get('backend')}  ({how.get('reason')})")
        else:
            print(f"kernel          {op:<20} {how}")
    return EXIT_OK


# ----------------------------------------------------------------------------- demo draft
def cmd_make_demo_draft(args: argparse.Namespace) -> int:
    from eagle3_backend.checkpoint.demo import make_demo_draft
    from eagle3_backend.layout import parse_layout_flag

    target = _target(args.target)
    layout = parse_layout_flag(args.layout, target.num_hidden_layers) if args.layout else None
    out, draft = make_demo_draft(args.out, target, seed=args.seed,
                                 draft_vocab_size=args.draft_vocab_size, dtype=args.dtype,
                                 force=args.force, layout=layout)
    cfg = draft.config
    print(f"wrote {out}: randomly initialised EAGLE-3 draft (seed {args.seed}) for "
          f"{target.architecture} {target.source}")
    how = (f"SGLang default for {target.num_hidden_layers} layers" if layout is None else
           "as given" if layout == cfg.layout else f"given as {layout}, stored in layer order")
    print(f"  layout {cfg.layout} ({how}), "
          f"hidden {cfg.hidden_size}, fc {cfg.fc_in_features} -> {cfg.hidden_size}")
    print(f"  draft vocab {cfg.draft_vocab_size} (target ids 0..{cfg.draft_vocab_size - 1}) of "
          f"{cfg.vocab_size}, {cfg.dtype}, {_fmt_int(draft.num_parameters)} parameters, "
          f"{'embedding from the target' if cfg.has_embed_tokens else 'no embedding'}")
    return EXIT_OK


def cmd_swap(args: argparse.Namespace) -> int:
    """POST /eagle3/draft/swap (or /rollback) to a running server; print what happened.

    Exit 0: the new draft is live; 1: the canary rolled it back; 2: refused (nothing changed);
    3: the server failed or could not be reached."""
    import os
    import urllib.error
    import urllib.request

    from eagle3_backend.serving import drafts
    from eagle3_backend.verify.bench import check_url

    check_url(args.url, "--url")
    if not args.timeout > 0:
        raise Eagle3Error(f"--timeout is {args.timeout}; expected > 0 seconds.")
    for flag, value, low in (("--probe-prompts", args.probe_prompts, 0),
                             ("--probe-tokens", args.probe_tokens, 1), ("--margin", args.margin, 0)):
        if value < low:
            raise Eagle3Error(f"{flag} is {value}; expected >= {low}.")
    if args.rollback:
        route, body = drafts.ROLLBACK_ROUTE, {}
    else:
        route = drafts.SWAP_ROUTE
        body = {"path": os.path.abspath(args.draft), "probe_prompts": args.probe_prompts,
                "probe_tokens": args.probe_tokens, "margin": args.margin, "keep_if_worse": args.keep_if_worse}
    key = args.api_key or os.environ.get("SGLANG_API_KEY")
    req = urllib.request.Request(args.url.rstrip("/") + route, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        print(f"eagle3 swap: cannot reach {args.url}: {getattr(exc, 'reason', exc)}. Is the server "
              f"up, and is this its --host/--port?", file=sys.stderr)
        return EXIT_INTERNAL
    try:
        out = json.loads(raw)
        assert isinstance(out, dict)
    except (ValueError, AssertionError):
        if status != 404:  # 404: an SGLang server without the routes, said below
            raise Eagle3Error(
                f"{args.url} answered HTTP {status} without a JSON body ({raw[:80]!r}): not an SGLang "
                f"server with the eagle3 plugin. Is this the server's --host/--port?") from None
        out = {"message": raw.decode(errors="replace")[:500]}
    if args.json:
        _print_json({"status": status, **out})
    else:
        for line in swap_lines(status, out):
            print(line)
    if out.get("success"):
        return EXIT_OK
    return EXIT_PROBLEMS if out.get("stage") == "rolled-back" else (EXIT_INTERNAL if status >= 500 else EXIT_BAD_INPUT)


def swap_lines(status: int, out: dict[str, Any]) -> list[str]:
    """What ``eagle3 swap`` prints for the server's answer."""
    from eagle3_backend.serving import drafts

    if status == 401:
        return ["refused: the server wants its API key (--api-key or $SGLANG_API_KEY)"]
    if status == 404:
        return ["refused: this server has no /eagle3/draft routes (not an EAGLE-3 launch with the "
                "eagle3_backend plugin, or the feature is off: see its log)"]
    lines = []
    if out.get("validated"):
        lines.append(f"validated: {out['path']} on the running target")
    if "staged" in out:
        n = out["staged"]["ranks"]
        lines.append(f"staged:    {out['staged']['seconds']:.2f} s, checked on {n} rank{'s' * (n != 1)}")
    if "committed" in out:
        c = out["committed"]
        lines.append(f"committed: {c['seconds']:.2f} s in place; prefix cache "
                     f"{'flushed' if c['cache_flushed'] else 'kept (requests were running)'}")
    if "canary" in out:
        c = out["canary"]
        a, b = drafts.fmt_accept(c["accept_length_before"]), drafts.fmt_accept(c["accept_length_after"])
        lines.append(f"canary:    {c['prompts']} probe prompts x {c['max_new_tokens']} tokens: acceptance "
                     f"{a} -> {b} (margin {c['margin']}); "
                     f"outputs {'identical' if c['outputs_identical'] else 'DIFFER'}; {c['verdict']}")
    state = "live" if out.get("success") else out.get("stage", "failed")
    lines.append(f"result:    {state}: {out.get('message', '')}")
    return lines


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from eagle3_backend.checkpoint.files import force_help

    p = argparse.ArgumentParser(
        prog="eagle3",
        description="EAGLE-3 draft checkpoints: inspect, convert, validate against a target.",
    )
    p.add_argument("--debug", action="store_true",
                   help="show tracebacks instead of one-paragraph errors")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def ckpt_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--allow-pickle", action="store_true",
                        help="accept .bin/.pt weights (read with torch.load(weights_only=True))")
        sp.add_argument("--ids-as", choices=("sglang", "specforge"), default="sglang",
                        help="how to read eagle_config layer ids when no eagle3_layout is "
                             "recorded: SGLang's rule for the target (default) or SpecForge's "
                             "'output of layer k, list order'")

    sp = sub.add_parser("inspect", help="show a draft's format, layout, dims, vocab map, dtype")
    sp.add_argument("ckpt", metavar="CKPT", help="draft checkpoint directory")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--target", metavar="T",
                    help="target config.json, model dir, GGUF or 'bundled' (for drafts that do not "
                         "record it)")
    ckpt_opts(sp)
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("convert", help="rewrite a draft as an SGLang or speculators checkpoint")
    sp.add_argument("src", metavar="SRC")
    sp.add_argument("dst", metavar="DST", help="new or empty output directory")
    sp.add_argument("--to", choices=("sglang", "speculators"), required=True)
    sp.add_argument("--target", metavar="T", help="target config.json, model dir, GGUF or 'bundled'")
    sp.add_argument("--force", action="store_true", help=force_help("DST"))
    sp.add_argument("--layout", metavar="LAYOUT",
                    help="record this layout for the fc slots, in their current order, instead of "
                         "the one read from SRC (e.g. the layout `eagle3 doctor` found)")
    ckpt_opts(sp)
    sp.set_defaults(func=cmd_convert)

    sp = sub.add_parser("validate", help="check a draft can be served on a target (exit 0/1)")
    sp.add_argument("ckpt", metavar="CKPT")
    sp.add_argument("--target", metavar="TARGET", required=True,
                    help="target HF config.json, model dir, GGUF file or 'bundled'")
    sp.add_argument("--json", action="store_true")
    launch = sp.add_argument_group("launch", "check SGLang launch flags too, as the plugin does")
    launch.add_argument("--speculative-algorithm", default="EAGLE3", type=str.upper,
                        choices=("EAGLE", "EAGLE3"))
    for flag in ("num-steps", "eagle-topk", "num-draft-tokens"):
        launch.add_argument(f"--speculative-{flag}", type=int, metavar="N")
    launch.add_argument("--context-length", type=int, metavar="N",
                        help="SGLang's --context-length (default: the target's own)")
    ckpt_opts(sp)
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("env", help="versions, CUDA, Triton and kernel backends")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_env)

    sp = sub.add_parser("make-demo-draft",
                        help="write a small random draft (SGLang format) for a target")
    sp.add_argument("out", metavar="OUT")
    sp.add_argument("--target", metavar="GGUF_OR_DIR", required=True,
                    help="target GGUF, model dir or 'bundled' (the bundled SmolLM2-135M-Instruct)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--draft-vocab-size", type=int, default=8192)
    sp.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    sp.add_argument("--layout", metavar="LAYOUT", default=None,
                    help="the fc input's sources, e.g. \"[embed, layer_input:3]\" (default: "
                         "SGLang's default for the target's layer count)")
    sp.add_argument("--force", action="store_true", help=force_help("OUT"))
    sp.set_defaults(func=cmd_make_demo_draft)

    from eagle3_backend.serving import drafts

    sp = sub.add_parser("swap", help="replace the EAGLE-3 draft of a running server (canary, rollback)")
    sp.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    what = sp.add_mutually_exclusive_group(required=True)
    what.add_argument("--draft", metavar="DIR", help="the new draft checkpoint (a path the server can read)")
    what.add_argument("--rollback", action="store_true", help="restore the draft the last swap replaced")
    sp.add_argument("--probe-prompts", type=int, default=drafts.PROBE_PROMPTS, metavar="N",
                    help="canary: MT-Bench first turns sent before and after (0: no canary)")
    sp.add_argument("--probe-tokens", type=int, default=drafts.PROBE_TOKENS, metavar="K")
    sp.add_argument("--margin", type=float, default=drafts.MARGIN,
                    help="accepted tokens per verify step the new draft may lose before it is rolled back")
    sp.add_argument("--keep-if-worse", action="store_true", help="keep the new draft even if the canary says worse")
    sp.add_argument("--api-key", help="the server's --api-key / --admin-api-key (default $SGLANG_API_KEY)")
    sp.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the answer")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_swap)

    from eagle3_backend.verify.cli import add_bench_parser, add_eval_parser
    add_eval_parser(sub)
    add_bench_parser(sub)
    from eagle3_backend.train.cli import add_train_parser
    add_train_parser(sub)
    from eagle3_backend.doctor.cli import add_doctor_parser
    add_doctor_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = (logging.ERROR, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # what reading a prompt file skipped or changed is always shown (never silently)
    logging.getLogger("eagle3_backend.verify.datasets").setLevel(min(level, logging.WARNING))
    try:
        return args.func(args)
    except Eagle3Error as exc:
        if args.debug:
            raise
        print(f"eagle3 {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if args.debug:
            raise
        print(f"eagle3 {args.command}: error: {exc.strerror or exc} "
              f"({exc.filename or 'no file name'}). Check the path, permissions and free space.",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"eagle3 {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so in one line, traceback only with --debug
        if args.debug:
            raise
        print(f"eagle3 {args.command}: internal error: {type(exc).__name__}: {exc}. This is a "
              f"bug in eagle3_backend; rerun with --debug for the traceback and report it.",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
