"""A local HTTP server speaking SGLang's JSON, for the bench client tests.

stdlib ``http.server`` in a thread on 127.0.0.1: a protocol peer with SGLang's
response shapes (native /generate meta_info, OpenAI ``sglext``, /server_info),
plus misbehaviours: slow answers (``delay``), bad JSON, HTTP 500. With
``one_token=SUFFIX`` a native prompt ending in SUFFIX is answered the way SGLang
answers a request that finished in its prefill (one token, ``stop``, no ``spec_*``
field: no verify step was counted).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tokens_for(text: str) -> tuple[int, int]:
    """(completion tokens, verify steps) the fake server reports for a prompt."""
    n = 6 + len(text) % 5
    return n, (n + 1) // 2


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _leave(self) -> None:
        """A POST leaves the in-flight count before its answer goes on the wire: a client
        that sends its next request the moment one is answered never overlaps two."""
        if getattr(self, "_counted", False):
            self._counted = False
            with self.server.lock:
                self.server.inflight -= 1

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self._leave()
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        if self.path == "/server_info":
            states = [{"avg_spec_accept_length": 1.75}] if self.server.spec else [{}]
            self._send(200, json.dumps({"internal_states": states, "speculative_algorithm":
                                        "EAGLE3" if self.server.spec else None,
                                        "speculative_num_steps": 3, "version": "0.5.23"}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.inflight += 1
            srv.max_inflight = max(srv.max_inflight, srv.inflight)
            srv.bodies.append((self.path, body))
        self._counted = True
        try:
            time.sleep(srv.delay)
            mode = srv.mode
            if mode == "bad-json":
                return self._send(200, b"<html>not json", "text/html")
            if mode == "500":
                return self._send(500, b'{"error": "boom"}')
            if self.path == "/generate":
                n, verify = tokens_for(body["text"])
                meta = {"prompt_tokens": 3, "completion_tokens": n,
                        "finish_reason": {"type": "length", "length": n}}
                if srv.one_token and body["text"].endswith(srv.one_token):
                    n, verify = 1, 0
                    meta = {"prompt_tokens": 3, "completion_tokens": 1,
                            "finish_reason": {"type": "stop", "matched": 2}}
                if srv.spec and verify:
                    meta |= {"spec_accept_length": n / verify, "spec_verify_ct": verify,
                             "spec_correct_drafts_histogram": [1, verify - 1]}
                ids = ["bad"] if mode == "bad-ids" else list(range(n))
                return self._send(200, json.dumps({"text": "x" * n, "output_ids": ids,
                                                   "meta_info": meta}).encode())
            if self.path == "/v1/chat/completions":
                n, verify = tokens_for(body["messages"][-1]["content"])
                resp = {"choices": [{"message": {"role": "assistant", "content": "x"}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": n}}
                if srv.spec and body.get("return_spec_tokens_details"):
                    resp["sglext"] = {"spec_tokens_details": {
                        "spec_accept_length": n / verify, "spec_verify_ct": verify,
                        "spec_correct_drafts_histogram": [0, verify]}}
                return self._send(200, json.dumps(resp).encode())
            self._send(404, b"{}")
        finally:
            self._leave()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, spec: bool = True, mode: str = "ok", delay: float = 0.02, one_token: str = ""):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spec, self.mode, self.delay, self.one_token = spec, mode, delay, one_token
        self.lock = threading.Lock()
        self.inflight = self.max_inflight = 0
        self.bodies: list = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def start_server(**kw) -> _Server:
    srv = _Server(**kw)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv
