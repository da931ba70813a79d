"""Live-server benchmark client: acceptance length and tok/s of running SGLang servers.

Speaks SGLang's native API (``POST /generate``; per-request
``meta_info.spec_accept_length``, ``spec_verify_ct``, ``completion_tokens``,
``spec_correct_drafts_histogram``) or its OpenAI-compatible API
(``POST /v1/chat/completions`` with ``return_spec_tokens_details``; the same
figures under ``sglext.spec_tokens_details``), and reads ``GET /server_info``
(``internal_states[0].avg_spec_accept_length``) after each concurrency level.

Every request has a hard deadline; a refused connection, a timeout, an HTTP
error or a body that is not the expected JSON is recorded for that request
and the run goes on. Nothing here can hang longer than the deadline.

A speculative server's answer without speculative metrics (SGLang omits every
``spec_*`` field when it counted no verify step for the request) is counted
and listed per level (``no_spec_metrics``), never folded into the acceptance
length: a request that finished in its prefill (one token, e.g. an immediate
end of sequence; SGLang decodes nothing there, so there is nothing to
speculate) apart from one that decoded more tokens with no verify step
counted (not speculated, or the metric lost).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.verify.metrics import acceptance_by_category

logger = logging.getLogger(__name__)

__all__ = [
    "check_reachable",
    "BenchSettings",
    "LevelResult",
    "RequestResult",
    "NotSGLangError",
    "fetch_server_info",
    "no_spec_metrics",
    "run_benchmark",
    "run_level",
]

APIS = ("native", "openai")


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """How requests are sent. ``timeout_s`` bounds each request end to end."""

    api: str = "native"
    max_new_tokens: int = 256
    temperature: float = 0.0
    timeout_s: float = 300.0
    model: str = "default"  # OpenAI "model" field
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise Eagle3Error(f"--api must be one of {APIS}, got {self.api!r}.")
        if self.max_new_tokens < 1:
            raise Eagle3Error(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}.")
        if self.temperature < 0:
            raise Eagle3Error(f"--temperature must be >= 0, got {self.temperature}.")
        if not self.timeout_s > 0:
            raise Eagle3Error(f"--timeout must be > 0 seconds, got {self.timeout_s}.")


@dataclass(slots=True)
class RequestResult:
    """One request: ``error`` is None on success, else one line saying what failed."""

    index: int
    ok: bool
    latency_s: float
    error: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    spec_histogram: list[int] | None = None
    finish_reason: str | None = None  # "length", "stop", ... as the server says
    output_ids: list[int] | None = None  # native API only


@dataclass(slots=True)
class LevelResult:
    """All requests of one concurrency level against one server."""

    concurrency: int
    wall_s: float
    requests: list[RequestResult]
    server_avg_spec_accept_length: float | None = None
    server_info_error: str | None = None

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    def summary(self, speculative: bool = True) -> dict[str, Any]:
        """Figures of the level; ``speculative`` False (a target-only server): no
        ``no_spec_metrics`` entry (none of its answers carries them, as expected)."""
        ok = self.ok
        tokens = sum(r.completion_tokens for r in ok)
        spec = [r for r in ok if r.spec_verify_ct]
        unmeasured = [r for r in ok if not r.spec_verify_ct]
        verify = sum(r.spec_verify_ct or 0 for r in spec)
        spec_tokens = sum(r.completion_tokens for r in spec)
        hist: list[int] = []
        for r in ok:
            for j, c in enumerate(r.spec_histogram or []):
                hist.extend([0] * (j + 1 - len(hist)))
                hist[j] += int(c)
        errors: dict[str, int] = {}
        for r in self.requests:
            if not r.ok:
                kind = (r.error or "error").split(":", 1)[0]
                errors[kind] = errors.get(kind, 0) + 1
        return {
            "concurrency": self.concurrency,
            "n_requests": len(self.requests),
            "n_ok": len(ok),
            "n_errors": len(self.requests) - len(ok),
            "errors_by_kind": errors,
            "wall_s": self.wall_s,
            "completion_tokens": tokens,
            "output_tokens_per_s": tokens / self.wall_s if self.wall_s > 0 and ok else 0.0,
            "mean_latency_s": sum(r.latency_s for r in ok) / len(ok) if ok else None,
            "acceptance_length": spec_tokens / verify if verify else None,
            "spec_verify_ct": verify,
            "n_spec_measured": len(spec),
            "no_spec_metrics": no_spec_metrics(unmeasured) if speculative else None,
            "acceptance_histogram": hist or None,
            "server_avg_spec_accept_length": self.server_avg_spec_accept_length,
            "server_info_error": self.server_info_error,
        }


def no_spec_metrics(unmeasured: Sequence[RequestResult]) -> dict[str, Any]:
    """The answered requests of a speculative server that carry no speculative metrics.

    ``finished_in_prefill``: at most one token, the one the prefill samples (SGLang runs
    no decode step, so no verify step, for them); ``decoded``: more tokens, yet no verify
    step counted. Both are request indices; their tokens are in ``completion_tokens``.
    """
    return {
        "n": len(unmeasured),
        "finished_in_prefill": [r.index for r in unmeasured if r.completion_tokens <= 1],
        "decoded": [r.index for r in unmeasured if r.completion_tokens > 1],
        "completion_tokens": sum(r.completion_tokens for r in unmeasured),
        "finish_reasons": _count(r.finish_reason or "none" for r in unmeasured),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# --------------------------------------------------------------------------- protocol
def _request_body(settings: BenchSettings, prompt: Any) -> tuple[str, dict[str, Any]]:
    """(path, JSON body). ``prompt`` is a str (native text) or a list of chat messages."""
    if settings.api == "native":
        body: dict[str, Any] = {
            "sampling_params": {
                "max_new_tokens": settings.max_new_tokens,
                "temperature": settings.temperature,
                "ignore_eos": settings.ignore_eos,
            },
        }
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            body["input_ids"] = prompt
        else:
            body["text"] = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        return "/generate", body
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return "/v1/chat/completions", {
        "model": settings.model,
        "messages": messages,
        "max_tokens": settings.max_new_tokens,
        "temperature": settings.temperature,
        "ignore_eos": settings.ignore_eos,
        "return_spec_tokens_details": True,
        "stream": False,
    }


def _parse_response(api: str, data: Any) -> dict[str, Any]:
    """Fields of a successful response; raises ValueError when the shape is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    if api == "native":
        if isinstance(data.get("error"), (dict, str)):
            raise ValueError(f"server error: {str(data['error'])[:200]}")
        meta = data.get("meta_info")
        if not isinstance(meta, dict) or "completion_tokens" not in meta:
            raise ValueError("no meta_info.completion_tokens in the /generate response")
        spec = meta
        usage_tokens, prompt_tokens = meta["completion_tokens"], meta.get("prompt_tokens")
        output_ids = data.get("output_ids")
        if output_ids is not None and not (isinstance(output_ids, list)
                                           and all(isinstance(i, int) for i in output_ids)):
            raise ValueError("output_ids in the /generate response is not a list of token ids")
        finish = meta.get("finish_reason")
        finish = finish.get("type") if isinstance(finish, dict) else finish
    else:
        output_ids = None
        choices = data.get("choices")
        finish = (choices[0].get("finish_reason")
                  if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None)
        usage = data.get("usage")
        if not isinstance(usage, dict) or "completion_tokens" not in usage:
            raise ValueError("no usage.completion_tokens in the chat completion response")
        ext = data.get("sglext") or {}
        spec = ext.get("spec_tokens_details") or {} if isinstance(ext, dict) else {}
        if isinstance(spec, list):
            spec = spec[0] if spec else {}
        usage_tokens, prompt_tokens = usage["completion_tokens"], usage.get("prompt_tokens")
    verify = spec.get("spec_verify_ct")
    return {
        "completion_tokens": int(usage_tokens),
        "prompt_tokens": None if prompt_tokens is None else int(prompt_tokens),
        "spec_accept_length": spec.get("spec_accept_length") if verify else None,
        "spec_verify_ct": int(verify) if verify else None,
        "spec_histogram": list(spec.get("spec_correct_drafts_histogram") or []) or None,
        "finish_reason": finish if isinstance(finish, str) else None,
        "output_ids": output_ids,
    }


async def _one_request(client: httpx.AsyncClient, url: str, settings: BenchSettings,
                       index: int, prompt: Any) -> RequestResult:
    path, body = _request_body(settings, prompt)
    t0 = time.perf_counter()

    def fail(kind: str, detail: str) -> RequestResult:
        return RequestResult(index, False, time.perf_counter() - t0, f"{kind}: {detail}")

    try:
        resp = await asyncio.wait_for(client.post(url.rstrip("/") + path, json=body),
                                      timeout=settings.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        return fail("timeout", f"no complete response within {settings.timeout_s:g}s")
    except httpx.ConnectError as exc:
        return fail("connection", f"cannot connect to {url} ({exc})")
    except httpx.HTTPError as exc:
        return fail("http", f"{type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return fail("http", f"HTTP {resp.status_code}: {resp.text[:200]!r}")
    try:
        fields = _parse_response(settings.api, resp.json())
    except (json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        return fail("bad-response", f"{exc} (body starts {resp.text[:120]!r})")
    return RequestResult(index, True, time.perf_counter() - t0, **fields)


class NotSGLangError(ValueError):
    """The server answered, but not as SGLang does (no /server_info, or not JSON there)."""


async def _server_info(client: httpx.AsyncClient, url: str, timeout_s: float) -> dict[str, Any]:
    last_exc: Exception | None = None
    for path in ("/server_info", "/get_server_info"):
        try:
            resp = await asyncio.wait_for(client.get(url.rstrip("/") + path), timeout=timeout_s)
        except (asyncio.TimeoutError, httpx.HTTPError) as exc:
            last_exc = exc
            break
        if resp.status_code == 404:
            continue
        if resp.status_code != 200:
            raise ValueError(f"GET {path}: HTTP {resp.status_code}")
        try:
            data = resp.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise NotSGLangError(f"GET {path}: expected a JSON object, got {resp.text[:60]!r}")
        return data
    if last_exc is not None:
        raise ValueError(f"GET /server_info failed: {type(last_exc).__name__}: {last_exc}")
    raise NotSGLangError("the server has neither /server_info nor /get_server_info")


def _avg_accept(info: dict[str, Any]) -> float | None:
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        return float(value) if isinstance(value, (int, float)) else None
    return None


def fetch_server_info(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """``GET /server_info`` of a live server (raises ValueError with one line on failure)."""
    async def go():
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return await _server_info(client, url, timeout_s)
    return asyncio.run(go())


_HOST_PORT = re.compile(r"^(?:[\w-]+(?:\.[\w-]+)*:\d+|[\w-]+(?:\.[\w-]+)+(?::\d+)?|localhost)(?:/\S*)?$")


def check_url(url: str, flag: str = "--url") -> None:
    """Refuse what is not an http(s) URL with a host, naming the fix (``eagle3 bench``,
    ``eagle3 swap``)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise Eagle3Error(f"{flag} {url!r} is not a URL ({exc}); expected e.g. "
                          "http://127.0.0.1:30000.") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        fix = f" Pass {flag} http://{url}." if _HOST_PORT.match(url) else ""
        raise Eagle3Error(f"{flag} {url!r} has no http:// or https:// scheme and host; expected "
                          f"e.g. http://127.0.0.1:30000.{fix}")


def check_reachable(url: str, flag: str = "--url", timeout_s: float = 10.0) -> None:
    """Refuse a URL no server answers at, in one line, before any prompt is sent.

    Any HTTP answer (even 404) counts as reachable, and so does a server that accepts the
    connection but is slow to answer; a malformed URL or a refused/unroutable connection
    does not.
    """
    check_url(url, flag)
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=timeout_s)) as client:
            client.get(url.rstrip("/") + "/health")
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise Eagle3Error(
            f"{flag} {url}: cannot connect ({exc or type(exc).__name__}); no server answers "
            "there. Start the SGLang server (python -m sglang.launch_server ... --port N) or "
            f"fix {flag}."
        ) from None
    except httpx.HTTPError:  # it accepted the connection: a slow or odd server, not a wrong URL
        return


# --------------------------------------------------------------------------- running
async def run_level(url: str, prompts: Sequence[Any], concurrency: int, settings: BenchSettings,
                    progress: bool = False, label: str = "") -> LevelResult:
    """Send every prompt, at most ``concurrency`` in flight; then read /server_info."""
    if concurrency < 1:
        raise Eagle3Error(f"concurrency must be >= 1, got {concurrency}.")
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s))
    sem = asyncio.Semaphore(concurrency)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc=f"{label} c={concurrency}", unit="req", leave=False)

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def guarded(i: int, prompt: Any) -> RequestResult:
            async with sem:
                res = await _one_request(client, url, settings, i, prompt)
            if bar is not None:
                bar.update(1)
            return res

        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(i, p) for i, p in enumerate(prompts)))
        wall = time.perf_counter() - t0
        level = LevelResult(concurrency, wall, list(results))
        try:
            level.server_avg_spec_accept_length = _avg_accept(
                await _server_info(client, url, min(10.0, settings.timeout_s)))
        except (ValueError, json.JSONDecodeError) as exc:
            level.server_info_error = str(exc)
    if bar is not None:
        bar.close()
    for r in level.requests:
        if not r.ok:
            logger.warning("%s request %d (c=%d): %s", label or url, r.index, concurrency, r.error)
    return level


def run_benchmark(
    url: str,
    prompts: Sequence[Any],
    concurrency: Sequence[int],
    settings: BenchSettings,
    baseline_url: str | None = None,
    warmup: int = 1,
    progress: bool = False,
    categories: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """Every concurrency level against the speculative server (and the baseline).

    Returns a JSON-ready dict: ``levels`` (one entry per level with ``spec``,
    ``baseline`` and ``speedup``), per-request ``requests`` and ``errors``. With
    ``categories`` (one per prompt), each level's ``spec`` also holds
    ``acceptance_by_category`` over the answers that carry speculative metrics.
    """
    if not prompts:
        raise Eagle3Error("no prompts to send; check --dataset / --limit.")
    servers = {"spec": url} | ({"baseline": baseline_url} if baseline_url else {})
    out: dict[str, Any] = {"settings": asdict(settings) | {"concurrency": list(concurrency),
                                                          "warmup": warmup,
                                                          "n_prompts": len(prompts)},
                           "servers": {}, "levels": [], "requests": {}, "errors": []}

    async def main() -> None:
        for role, server in servers.items():
            info: dict[str, Any] = {"url": server}
            try:
                data = await asyncio.wait_for(_fetch_info(server, settings), settings.timeout_s + 5)
                info["server_info"] = _info_subset(data)
            except (ValueError, asyncio.TimeoutError) as exc:
                info["server_info_error"] = str(exc)
            out["servers"][role] = info
            if warmup:
                await run_level(server, list(prompts[:warmup]), 1, settings)
        for c in concurrency:
            entry: dict[str, Any] = {"concurrency": c}
            for role, server in servers.items():
                level = await run_level(server, prompts, c, settings, progress, label=role)
                entry[role] = level.summary(speculative=role == "spec")
                if role == "spec" and categories is not None:
                    entry[role]["acceptance_by_category"] = acceptance_by_category(
                        (categories[r.index], r.completion_tokens, r.spec_verify_ct)
                        for r in level.ok if r.spec_verify_ct)
                out["requests"].setdefault(role, {})[str(c)] = [
                    {k: v for k, v in asdict(r).items() if k != "output_ids"} for r in level.requests]
                out["errors"].extend({"server": role, "concurrency": c, "index": r.index,
                                      "error": r.error} for r in level.requests if not r.ok)
            base = entry.get("baseline")
            spec_tps = entry["spec"]["output_tokens_per_s"]
            entry["speedup"] = (spec_tps / base["output_tokens_per_s"]
                                if base and base["output_tokens_per_s"] and spec_tps else None)
            out["levels"].append(entry)

    asyncio.run(main())
    return out


async def _fetch_info(url: str, settings: BenchSettings) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=min(10.0, settings.timeout_s)) as client:
        return await _server_info(client, url, min(10.0, settings.timeout_s))


_INFO_KEYS = ("model_path", "served_model_name", "speculative_algorithm",
              "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
              "speculative_num_draft_tokens", "dtype", "device", "attention_backend", "version",
              "tp_size")


def _info_subset(info: dict[str, Any]) -> dict[str, Any]:
    sub = {k: info[k] for k in _INFO_KEYS if k in info}
    sub["avg_spec_accept_length"] = _avg_accept(info)
    return sub
