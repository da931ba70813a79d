"""SGLang plugin: serve every EAGLE-3 draft with exactly the hidden states it was trained on.

Installed means active. ``pyproject.toml`` registers :func:`plugin` under
SGLang's ``sglang.srt.plugins`` entry-point group as ``eagle3``; SGLang's
``load_plugins()`` calls it in every process (launcher, schedulers,
detokenizer) and then applies the hooks it registered. ``SGLANG_PLUGINS``
(a comma-separated allow list) excludes it when it does not name ``eagle3``.

The unchanged command then serves EAGLE-3 through this backend::

    python -m sglang.launch_server --model-path TARGET \\
        --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT ...

What it does, by module: ``hooks`` (the table of every SGLang target, checked
before registering), ``checks`` (refusals before loading weights),
``capture`` + ``collect`` (layout-exact capture packed into the fc input),
``selfcheck`` (warm-up check), ``runtime`` (the hook handlers).

Nothing is imported from SGLang until :func:`plugin` runs.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

__all__ = ["plugin"]


def plugin() -> None:
    """The ``sglang.srt.plugins`` entry point: verify the hook table, then register.

    ``main`` rows (the launcher's pre-load checks, and the request check that
    answers requests that would stop the scheduler with a 400) are registered
    in every process, for every launch. The scheduler-side rows only in the processes of an EAGLE-3
    launch that passed those checks (the launcher hands them the checked plan
    in ``$EAGLE3_SERVING_PLAN``), so other launches import nothing more.

    A missing or changed hook target stops the process with one line naming
    the SGLang version and the target (SystemExit: SGLang's loader logs and
    swallows ordinary exceptions, which would leave SGLang running unpatched).
    """
    from eagle3_backend.serving import checks, hooks

    problems = hooks.verify("main")
    plan_text = os.environ.get(checks.PLAN_ENV)
    if not problems and plan_text:
        from eagle3_backend.serving.runtime import process_plan

        problems = hooks.verify("serve") + hooks.verify_arch(process_plan().architecture)
    from eagle3_backend.cpu import entry as cpu_entry

    on_cpu = cpu_entry.applies()  # the CPU engine with this package's platform
    if not problems and on_cpu:
        problems = hooks.verify("cpu")
    if problems:
        line = hooks.fail_closed_line(problems[0])
        logger.error("%s", line)
        raise SystemExit(line)
    done = hooks.register("main")
    if on_cpu:
        done += hooks.register("cpu")
    if plan_text:
        done += hooks.register("serve")
    done += _register_draft_admin(plan_text)
    logger.info("eagle3_backend plugin: registered %d SGLang hooks (SGLang %s)", len(done),
                hooks.sglang_version())


def _register_draft_admin(plan_text: str | None) -> list[str]:
    """The optional live-draft admin (serving/drafts.py): never stops a process.

    The main process (the launcher) registers the route hook, which adds the routes only when
    its pre-load checks turned the feature on; the schedulers of an EAGLE-3 launch register
    the scheduler rows when the launcher said so (``$EAGLE3_DRAFT_ADMIN``). Missing rows: the
    launcher logs the one line (``drafts.decide_in_launcher``); a process registers nothing.
    """
    import multiprocessing

    from eagle3_backend.serving import drafts, hooks

    if multiprocessing.parent_process() is None:
        return hooks.register("draft-http") if not hooks.verify("draft-http") else []
    if plan_text and os.environ.get(drafts.DRAFT_ENV) == "1":
        problems = hooks.verify("draft")
        if problems:
            logger.warning("%s", drafts.off_line(problems[0]))
            return []
        return hooks.register("draft")
    return []
