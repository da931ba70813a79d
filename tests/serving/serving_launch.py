"""Helpers of the serving tests: declared entry points, subprocess env, bounded server launches."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from eagle3_backend.cpu.launch import free_port

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def declared_entry_points() -> dict[str, dict[str, str]]:
    """``{group: {name: value}}`` from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {group: dict(eps) for group, eps in project.get("entry-points", {}).items()}


def subprocess_env(plugin_site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "SGLANG_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_site), str(REPO)])
    env.update(extra)
    return env


@dataclass
class Launch:
    returncode: int | None  # None: still running when stopped (it got past the checks)
    output: str
    seconds: float


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    started: float

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> bool:
        """True once ``text`` is in the output; False if it exits or ``timeout`` passes first."""
        while time.monotonic() - self.started < timeout:
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                return text in self.output
            time.sleep(0.5)
        return False


@contextlib.contextmanager
def running_server(args: list[str], env: dict[str, str], log: Path) -> Iterator[Server]:
    """``python -m sglang.launch_server ARGS`` (CPU engine) in its own process group.

    The whole group is stopped when the block ends, however it ends.
    """
    port = free_port()
    cmd = [PYTHON, "-m", "sglang.launch_server", "--device", "cpu", "--max-total-tokens", "4096",
           "--host", "127.0.0.1", "--port", str(port), *args]
    env = {**env, "SGLANG_USE_CPU_ENGINE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=log.parent, start_new_session=True)
        try:
            yield Server(proc, port, log, time.monotonic())
        finally:
            _stop_group(proc)


def launch_server(args: list[str], env: dict[str, str], log: Path, timeout: float,
                  stop_when: str | None = None) -> Launch:
    """Run a launch until it exits, ``stop_when`` appears in its output, or ``timeout``.

    In the last two cases it is stopped and ``returncode`` is None.
    """
    with running_server(args, env, log) as server:
        while True:
            rc = server.proc.poll()
            if rc is not None:
                break
            if stop_when is not None and stop_when in server.output:
                rc = None
                break
            if time.monotonic() - server.started > timeout:
                rc = None
                break
            time.sleep(0.5)
        seconds = time.monotonic() - server.started
    return Launch(rc, log.read_text(errors="replace"), seconds)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop every process of the group this test started (its id is the launcher's pid)."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(pgid):
            break
        os.killpg(pgid, sig)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _group_alive(pgid):
            proc.poll()  # reap the launcher so the group can empty
            time.sleep(0.2)
    proc.wait(timeout=5)
