"""Start, query and stop a CPU SGLang server, bounded in time (tests, benchmarks, demos).

``CpuServer`` runs ``python -m sglang.launch_server --device cpu ...`` in its
own process group with ``SGLANG_USE_CPU_ENGINE=1``, waits until SGLang logs
that it is ready (or gives up after ``start_timeout`` seconds), and on exit
stops the whole group (SIGTERM, then SIGKILL). Requests go through
``post``, ``stream`` or ``generate``, each with a per-request timeout, so no
caller can hang on a server.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

READY_LINE = "The server is fired up and ready to roll!"
BIND_ERROR = "error while attempting to bind on address"  # uvicorn, when the HTTP port is taken
#: What the eagle3 plugin's launcher logs once its pre-load checks passed (serving/runtime.py).
PLUGIN_ACTIVE_LINE = "eagle3_backend: pre-load checks passed"
#: The environment of a server with this package's CPU platform but stock SGLang's own
#: capture: the eagle3 plugin left out of SGLang's plugin allow list.
STOCK_CAPTURE_ENV = {"SGLANG_PLUGINS": "eagle3_cpu"}


class ServerError(RuntimeError):
    """The server did not start, died, or a request failed."""


def entry_point_site(pyproject: Path, dest: Path) -> Path:
    """A directory to put on PYTHONPATH so that SGLang discovers this package's entry points.

    When the installed distribution already declares every entry point of
    ``pyproject`` (``pip install -e .``), ``dest`` stays empty. Otherwise it
    gets an ``eagle3_backend-<version>.dist-info`` whose ``entry_points.txt``
    is generated from the ``[project.entry-points.*]`` tables, so the servers
    see exactly what the package declares (the CPU platform, the serving plugin).
    """
    import tomllib
    from importlib.metadata import entry_points

    project = tomllib.loads(Path(pyproject).read_text())["project"]
    declared = {g: dict(eps) for g, eps in project.get("entry-points", {}).items()}
    dest.mkdir(parents=True, exist_ok=True)
    if all(any(ep.name == n and ep.value == v for ep in entry_points(group=g))
           for g, eps in declared.items() for n, v in eps.items()):
        return dest
    info = dest / f"eagle3_backend-{project['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, eps in declared.items():
        lines += [f"[{group}]", *(f"{n} = {v}" for n, v in eps.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return dest


def sse_events(lines: Iterable[bytes]) -> tuple[list[Any], bool]:
    """The JSON payloads of a server-sent-event stream's ``data:`` lines, and whether it ended in [DONE].

    SGLang's streams (``/generate`` and the OpenAI endpoints) send one JSON object a
    ``data:`` line and close with ``data: [DONE]``; other lines (blank separators) are skipped.
    """
    events: list[Any] = []
    for raw in lines:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return events, True
        events.append(json.loads(payload))
    return events, False


def _json_or_text(raw: bytes) -> Any:
    """A response body: parsed JSON, else the text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What to serve. ``draft`` None means target-only; the speculative fields follow SGLang's flags."""

    target: str
    draft: str | None = None
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int = 4
    dtype: str = "float32"
    max_total_tokens: int = 4096
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.draft is not None and self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(
                f"chain speculation (topk=1) verifies num_steps + 1 = {self.num_steps + 1} tokens; "
                f"got num_draft_tokens={self.num_draft_tokens}. Pass num_draft_tokens="
                f"{self.num_steps + 1} or topk > 1.")

    def args(self, port: int) -> list[str]:
        out = ["--model-path", self.target, "--device", "cpu", "--dtype", self.dtype,
               "--max-total-tokens", str(self.max_total_tokens),
               "--host", "127.0.0.1", "--port", str(port)]
        if self.draft is not None:
            out += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", self.draft,
                    "--speculative-num-steps", str(self.num_steps),
                    "--speculative-eagle-topk", str(self.topk),
                    "--speculative-num-draft-tokens", str(self.num_draft_tokens)]
        return out + list(self.extra_args)


@dataclass
class CpuServer:
    """Context manager around one server process group."""

    spec: ServerSpec
    log_path: Path
    pythonpath: tuple[str, ...] = ()
    start_timeout: float = 600.0
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    api_key: str | None = None  # sent as "Authorization: Bearer KEY" (pass --api-key in the spec)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(self.env_extra)
        return env

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def plugin_active(self) -> bool:
        """Whether the eagle3 plugin checked and configured this server (its log says so)."""
        return PLUGIN_ACTIVE_LINE in self.log_text()

    def start(self) -> "CpuServer":
        """Start the server and wait for its ready line. A port this object picked that another
        process takes first (uvicorn's bind error; SGLang then hangs in shutdown instead of
        exiting) is given up for a fresh one, up to three times; a port the caller chose is an error."""
        chosen = not self.port
        for _ in range(3):
            self.port = self.port or free_port()
            if self._start_once():
                return self
            if not chosen:
                raise ServerError(f"port {self.port} is already in use by another process; free it "
                                  f"or start the server on another port. Log: {self.log_path}")
            logger.warning("port %d was taken before the server bound it; retrying on another", self.port)
            self.port = 0
        raise ServerError(f"three free ports were taken before the server could bind them; see {self.log_path}")

    def _start_once(self) -> bool:
        """One launch: True once ready, False when the HTTP port could not be bound."""
        cmd = [sys.executable, "-m", "sglang.launch_server", *self.spec.args(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting %s", " ".join(cmd))
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                         start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            log = self.log_text()
            if BIND_ERROR in log:
                self.stop()
                return False
            if self.proc.poll() is not None:
                self.stop()
                raise ServerError(f"server exited with code {self.proc.returncode} before it was "
                                  f"ready; log {self.log_path} ends:\n{log[-3000:]}")
            if READY_LINE in log:
                return True
            time.sleep(1.0)
        self.stop()
        raise ServerError(f"server not ready after {self.start_timeout:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        """Stop every process of the group this object started."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                self.proc.poll()
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("server launcher %d did not exit", pgid)

    def __enter__(self) -> "CpuServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _request(self, path: str, body: bytes | dict | None) -> urllib.request.Request:
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.url + path, data=data, headers=headers)

    def _send(self, req: urllib.request.Request, timeout: float) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        return status, _json_or_text(raw)

    def post(self, path: str, body: bytes | dict, timeout: float = 300.0) -> tuple[int, Any]:
        """POST and return (HTTP status, parsed JSON or raw text). Never raises on HTTP errors."""
        return self._send(self._request(path, body), timeout)

    def get(self, path: str, timeout: float = 300.0) -> tuple[int, Any]:
        """GET and return (HTTP status, parsed JSON or raw text). Never raises on HTTP errors."""
        return self._send(self._request(path, None), timeout)

    def stream(self, path: str, body: dict, timeout: float = 300.0) -> tuple[int, list[Any], bool]:
        """POST a streaming request: (HTTP status, the JSON events, whether the stream ended in [DONE])."""
        try:
            with urllib.request.urlopen(self._request(path, body), timeout=timeout) as resp:
                return resp.status, *sse_events(resp)
        except urllib.error.HTTPError as err:
            return err.code, [_json_or_text(err.read())], False

    def generate(self, input_ids: list[int], max_new_tokens: int, timeout: float = 300.0) -> dict:
        """Greedy generation; returns SGLang's response (output_ids, meta_info)."""
        status, out = self.post("/generate", {
            "input_ids": input_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
        }, timeout=timeout)
        if status != 200 or not isinstance(out, dict):
            raise ServerError(f"/generate returned HTTP {status}: {str(out)[:500]}")
        return out
