"""The served-vs-offline check of ``eagle3 doctor --url``: does a live server accept what the draft should?

The layout check (:mod:`eagle3_backend.doctor.diagnose`) asks whether a checkpoint
records the hidden states its draft was trained on. It cannot see the server:
a launch without this package's plugin, a server pointed at another draft or
target, an engine version with other id conventions. Each of those serves
the same draft on other inputs, and the only symptom is a lower acceptance
length. So ``eagle3 doctor DRAFT --url URL`` measures it:

1. ``GET /server_info``: the server's speculative settings (steps, top-k,
   draft tokens), draft and target paths;
2. the same prompts, as token ids through the same chat template, greedy,
   to ``POST /generate``, one at a time: per request the served acceptance
   length (``meta_info.spec_accept_length``) and the answer;
3. meanwhile (a thread sends 2 while this one computes) the offline verifier
   (:class:`eagle3_backend.verify.engine.SpeculativeEngine`) runs the same draft, as
   recorded, on the same target with the server's settings: the acceptance length a
   correctly wired server gets.

Served and offline acceptance are compared prompt by prompt (paired t over
prompts). MISMATCH when they differ by at least ``REL_GAP`` of the offline
speculative gain (acceptance - 1) and by ``T_MISMATCH`` standard errors;
WEAK when the draft gains too little offline to tell. Greedy answers are
compared too: identical in the same dtype, they may drift apart in another
one (bf16 server, fp32 doctor), which changes neither acceptance much.

    report = check_server(url, draft_dir, target, prompts, max_new_tokens=48)
    report.verdict, report.served_acceptance, report.offline_acceptance
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_backend.doctor.verdict import MISMATCH, OK, WEAK
from eagle3_backend.errors import Eagle3Error

MIN_OFFLINE_GAIN = 0.10   # offline acceptance below 1.10: too little to compare a server against
REL_GAP = 0.15            # served vs offline differ by >= 15% of the offline gain (acceptance - 1) ...
T_MISMATCH = 3.0          # ... and by >= 3 standard errors of the per-prompt differences
MIN_PROMPTS = 5           # fewer prompts make the paired t meaningless

_SPEC_ALGOS = ("EAGLE", "EAGLE3")


@dataclass(slots=True)
class PromptResult:
    """One prompt: offline and served counts; ``diverge_at`` is the first answer token
    where the served answer differs from the offline one (None: identical)."""

    id: str
    prompt_tokens: int
    offline_tokens: int
    offline_steps: int
    served_tokens: int
    served_steps: int
    diverge_at: int | None

    @property
    def offline_acceptance(self) -> float:
        return self.offline_tokens / self.offline_steps if self.offline_steps else 1.0

    @property
    def served_acceptance(self) -> float:
        return self.served_tokens / self.served_steps if self.served_steps else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "prompt_tokens": self.prompt_tokens,
                "offline": {"tokens": self.offline_tokens, "verify_steps": self.offline_steps,
                            "acceptance_length": round(self.offline_acceptance, 4)},
                "served": {"tokens": self.served_tokens, "verify_steps": self.served_steps,
                           "acceptance_length": round(self.served_acceptance, 4)},
                "answers_diverge_at": self.diverge_at}


@dataclass(slots=True)
class ServeReport:
    url: str
    draft: str
    settings: dict[str, int]
    server: dict[str, Any]
    prompts: list[PromptResult]
    verdict: str
    message: str
    t: float
    notes: list[str] = field(default_factory=list)

    @property
    def offline_acceptance(self) -> float:
        return _ratio(self.prompts, "offline")

    @property
    def served_acceptance(self) -> float:
        return _ratio(self.prompts, "served")

    @property
    def identical_answers(self) -> int:
        return sum(p.diverge_at is None for p in self.prompts)

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "draft": self.draft, "verdict": self.verdict,
                "message": self.message, "settings": self.settings, "server": self.server,
                "offline_acceptance_length": round(self.offline_acceptance, 4),
                "served_acceptance_length": round(self.served_acceptance, 4),
                "paired_t": _json_number(self.t),
                "identical_answers": self.identical_answers, "notes": self.notes,
                "prompts": [p.as_dict() for p in self.prompts]}


def _json_number(x: float) -> float | str | None:
    """Strict JSON has no NaN or infinity: None for NaN, "inf" / "-inf" as strings."""
    if math.isnan(x):
        return None
    return round(x, 2) if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _ratio(prompts: Sequence[PromptResult], which: str) -> float:
    tokens = sum(getattr(p, f"{which}_tokens") for p in prompts)
    steps = sum(getattr(p, f"{which}_steps") for p in prompts)
    return tokens / steps if steps else 1.0


# ------------------------------------------------------------------------ statistics
def paired_t(served: Sequence[float], offline: Sequence[float]) -> float:
    """t of the mean per-prompt difference served - offline (nan with fewer than 2 prompts;
    +-inf when every difference is the same non-zero value)."""
    if len(served) != len(offline):
        raise ValueError(f"{len(served)} served and {len(offline)} offline values")
    n = len(served)
    if n < 2:
        return math.nan
    d = [s - o for s, o in zip(served, offline)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    if var == 0.0:
        return 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    return mean / math.sqrt(var / n)


def judge_serve(prompts: Sequence[PromptResult], server_draft: str | None = None) -> tuple[str, str, float]:
    """(verdict, message, t) from the per-prompt offline and served acceptance lengths."""
    offline, served = _ratio(prompts, "offline"), _ratio(prompts, "served")
    t = paired_t([p.served_acceptance for p in prompts], [p.offline_acceptance for p in prompts])
    gain = offline - 1.0
    figures = (f"served acceptance length {served:.2f}, offline {offline:.2f} with the server's "
               f"settings on the same {len(prompts)} prompts")
    if gain < MIN_OFFLINE_GAIN:
        return WEAK, (
            f"{figures}: offline the draft gains only {gain:.2f} tokens per verify step, too "
            f"little to tell a miswired server from a working one. Check the draft first: "
            f"`eagle3 doctor` without --url scores its layouts; a draft trained on other prompts "
            f"or another target may need prompts closer to its training data (--dataset)."), t
    gap = served - offline
    where = f" (the server's draft: {server_draft})" if server_draft else ""
    if abs(gap) >= REL_GAP * gain and abs(t) >= T_MISMATCH:
        if gap < 0:
            return MISMATCH, (
                f"{figures}: the server loses {-gap / gain:.0%} of the speculative gain (paired "
                f"t = {t:.1f}). It does not serve this draft on the hidden states it was trained on. "
                f"Check that the server runs with the eagle3_backend plugin (its start-up log says "
                f"'eagle3_backend: pre-load checks passed' and 'EAGLE-3 layout ... (checked)'), "
                f"that it serves this draft{where} and this target, and that SGLANG_PLUGINS, if "
                f"set, includes 'eagle3'."), t
        return MISMATCH, (
            f"{figures}: the server accepts more than this draft can (paired t = {t:.1f}), so "
            f"it serves another draft{where} or another target than the ones given here. Pass "
            f"the served draft as DRAFT and the served target as --target."), t
    return OK, (f"{figures} (paired t = {t:.1f}): the server gets what this draft and target "
                f"get offline."), t


# ---------------------------------------------------------------------------- server
def server_settings(info: dict[str, Any], url: str) -> dict[str, int]:
    """The speculative settings a server runs with, from its /server_info."""
    algo = info.get("speculative_algorithm")
    if algo is None or str(algo).upper() not in _SPEC_ALGOS:
        raise Eagle3Error(
            f"the server at {url} runs speculative_algorithm={algo!r}, not EAGLE3: there is no "
            f"draft to check. Point --url at the EAGLE-3 server (launched with "
            f"--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT).")
    out = {}
    for key in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
        value = info.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise Eagle3Error(f"the server at {url} reports {key}={value!r} in /server_info; "
                              f"expected a positive integer (is it SGLang 0.5.23?).")
        out[key] = value
    return out


def _query(url: str, id_lists: Sequence[list[int]], max_new_tokens: int,
           timeout_s: float) -> list[Any]:
    from eagle3_backend.verify.bench import BenchSettings, run_level

    settings = BenchSettings(api="native", max_new_tokens=max_new_tokens, temperature=0.0,
                             timeout_s=timeout_s)
    level = asyncio.run(run_level(url, [list(ids) for ids in id_lists], 1, settings))
    failed = [r for r in level.requests if not r.ok]
    if failed:
        raise Eagle3Error(f"{len(failed)} of {len(id_lists)} requests to {url} failed; the "
                          f"first: {failed[0].error}. Is the server up and serving this target?")
    return level.requests


def drop_prefill_answers(encoded: Sequence[Any], served: Sequence[Any]) -> tuple[list, list, list[str]]:
    """(prompts, answers) without those the server finished in their prefill (one output token
    at most: SGLang counts no verify step and sends no spec metrics for them), and their ids."""
    keep = [len(r.output_ids or ()) > 1 for r in served]
    return ([e for e, k in zip(encoded, keep) if k], [r for r, k in zip(served, keep) if k],
            [e[0] for e, k in zip(encoded, keep) if not k])


def _same_path(a: str | None, b: str | Path) -> bool | None:
    """Whether two paths name the same directory; None when ``a`` is not a local path."""
    if not a or not Path(a).exists():
        return None
    return Path(a).resolve() == Path(b).resolve()


def _offline(engine: Any, encoded: Sequence[Any], max_new_tokens: int, progress: bool,
             stop: Future) -> list[Any]:
    """The offline verifier's result for each prompt, in order; stops early when the served
    side (``stop``) failed, whose error then surfaces from its result."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(encoded), desc="doctor: offline verifier", unit="prompt")
    out = []
    for _, ids in encoded:
        if stop.done() and stop.exception() is not None:
            break
        out.append(engine.generate(ids, max_new_tokens))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


def check_server(url: str, draft_path: str | Path, target: Any, prompts: Sequence[Any], *,
                 max_new_tokens: int = 48, chat_template: bool = True,
                 max_prompt_tokens: int = 512, timeout_s: float = 300.0,
                 progress: bool = False, loaded: Any = None) -> ServeReport:
    """Served vs offline acceptance of ``draft_path`` on ``target`` over ``prompts``.

    target: a loaded :class:`eagle3_backend.verify.targets.Target` (the one the server
    should run); prompts: :class:`eagle3_backend.verify.datasets.Prompt` objects; loaded:
    the checkpoint already read by ``load_draft`` against this target (else read here).
    """
    from eagle3_backend.verify.bench import fetch_server_info
    from eagle3_backend.verify.datasets import encode_prompts
    from eagle3_backend.verify.engine import SpeculativeEngine, load_draft_model
    from eagle3_backend.verify.tree import SpecSettings

    encoded, _ = encode_prompts(target.tokenizer, prompts, max_prompt_tokens=max_prompt_tokens,
                                chat_template=chat_template)
    if len(encoded) < MIN_PROMPTS:
        raise Eagle3Error(f"{len(encoded)} of the {len(prompts)} prompts are 1 to max_prompt_tokens="
                          f"{max_prompt_tokens} tokens long after the chat template; comparing a "
                          f"server with the offline verifier needs at least {MIN_PROMPTS} (a paired "
                          f"test over prompts). Pass more or shorter prompts (--limit, --dataset).")
    try:
        info = fetch_server_info(url, timeout_s=min(30.0, timeout_s))
    except ValueError as exc:
        raise Eagle3Error(f"cannot read /server_info from {url}: {exc}. Is an SGLang server "
                          f"running there?") from None
    settings = server_settings(info, url)
    engine = SpeculativeEngine(target, load_draft_model(draft_path, target, loaded=loaded),
                                SpecSettings(**settings))
    # the server answers while the offline verifier runs here: two machines' (or cores') work
    # at once, and the served answers are only compared once both are done
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(_query, url, [ids for _, ids in encoded], max_new_tokens, timeout_s)
        offline = _offline(engine, encoded, max_new_tokens, progress, stop=asked)
        served = asked.result()
    rows, served, in_prefill = drop_prefill_answers(   # rows: (id, prompt ids, offline result)
        [(pid, ids, res) for (pid, ids), res in zip(encoded, offline)], served)
    if len(rows) < MIN_PROMPTS:
        raise Eagle3Error(f"only {len(rows)} prompts got more than one answer token from {url} "
                          f"({len(in_prefill)} were answered in their prefill, nothing to speculate); "
                          f"the comparison needs at least {MIN_PROMPTS}. Pass more prompts (--limit, "
                          f"--dataset), or a chat template if the target ends raw text at once.")
    for field_name, why in (("spec_verify_ct", "it did not run speculative decoding on them"),
                            ("output_ids", "expected SGLang's native /generate response")):
        missing = [row[0] for row, r in zip(rows, served) if not getattr(r, field_name)]
        if missing:
            raise Eagle3Error(f"the server at {url} returned no {field_name} for prompt(s) "
                              f"{missing[:3]}: {why}.")

    results = []
    for (pid, ids, res), r in zip(rows, served):
        got = r.output_ids
        diverge = next((i for i, (a, b) in enumerate(zip(got, res.tokens)) if a != b),
                       None if len(got) == len(res.tokens) else min(len(got), len(res.tokens)))
        results.append(PromptResult(pid, len(ids), res.completion_tokens, res.verify_steps,
                                    r.completion_tokens, r.spec_verify_ct, diverge))

    server_draft = info.get("speculative_draft_model_path")
    server_target = info.get("model_path")
    verdict, message, t = judge_serve(results, server_draft)
    notes = []
    if _same_path(server_draft, draft_path) is False:
        notes.append(f"the server serves the draft at {server_draft}, not {draft_path}")
    if _same_path(server_target, target.path) is False:
        notes.append(f"the server's target is {server_target}, the doctor's {target.path}")
    if in_prefill:
        notes.append(f"{len(in_prefill)} prompt(s) answered in their prefill with one token at most "
                     f"(nothing to speculate) were left out: {in_prefill[:5]}")
    first_token_differs = sum(p.diverge_at == 0 for p in results)
    if first_token_differs * 2 > len(results):
        notes.append(f"{first_token_differs} of {len(results)} served answers differ from the "
                     f"offline target's from their first token: the server probably runs another "
                     f"target or tokenizer than --target")
    return ServeReport(url=url, draft=str(draft_path), settings=settings,
                       server={"draft": server_draft, "target": server_target,
                               "version": info.get("version")},
                       prompts=results, verdict=verdict, message=message, t=t, notes=notes)
