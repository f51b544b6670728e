"""A small OpenAI-compatible upstream for `truthlens dev`, the e2e tests and the benchmark.

Real HTTP/1.1 over a socket (stdlib `http.server`, one thread per connection, keep-alive), so
Envoy talks to it exactly as it would to a real LLM server. Answers are deterministic:

* the demo answer repeats the first sentences of the grounding it can see (system prompt, tool
  results, documents in user turns as the gateway finds them) and then adds one claim that no
  document supports, so a detection is visible;
* a request header `x-demo-script: NAME` selects a scripted reply instead (exact body bytes,
  status, content type, gzip, explicit chunk splits, delays) for tests that need byte control.

Every request is recorded (method, path, headers, body) so tests can assert what reached the
upstream after the gateway mutated it.
"""

from __future__ import annotations

import gzip as gzip_lib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from functools import cache
from typing import Any

SCRIPT_HEADER = "x-demo-script"
DEMO_MODEL = "truthlens-demo"
# The one sentence the demo adds to every grounded answer: supported by no document, on purpose.
INJECTED_CLAIM = "It was first described in 1887 by a research team in Oslo, Norway."
# What the demo "model knows" without context, like an LLM's parametric memory: the gateway removes
# the `truthlens_context` field before the request goes upstream, so the README's Eiffel Tower
# example must be answered from here. Keys are matched in the lower-cased question.
KNOWN_FACTS = {
    "eiffel tower": "The Eiffel Tower was built from 1887 to 1889 in Paris.",
}


@dataclass(slots=True)
class Script:
    """One scripted reply. `chunks` (if set) are written one by one with chunked encoding."""

    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    chunks: list[bytes] | None = None
    gzip: bool = False
    delay_s: float = 0.0  # between chunks
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Script:
        def as_bytes(v: Any) -> bytes:
            return v.encode() if isinstance(v, str) else json.dumps(v).encode()

        chunks = data.get("chunks")
        return cls(
            status=int(data.get("status", 200)),
            content_type=str(data.get("content_type", "application/json")),
            body=as_bytes(data.get("body", b"")) if "body" in data else b"",
            chunks=[as_bytes(c) for c in chunks] if chunks is not None else None,
            gzip=bool(data.get("gzip", False)),
            delay_s=float(data.get("delay_ms", 0)) / 1000.0,
            headers={str(k): str(v) for k, v in (data.get("headers") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


def _text(content: Any) -> str:
    """OpenAI `content` is a string or a list of parts; keep the text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


REFINE_MARKER = "Rewrite your answer"  # TruthLens standard mode's re-ask (extproc.gateway.mitigation)


@cache
def _grounding_rules() -> Any:
    """The default `truthlens.grounding` layouts: the demo sees the documents the gateway sees."""
    from extproc.config import default_config
    from extproc.protocol.grounding import GroundingRules, GroundingSettings

    g = default_config().truthlens.grounding
    return GroundingRules(GroundingSettings(True, True, True, True, g.section_labels, g.question_labels, g.tags,
                                            g.patterns))


def demo_answer(messages: list[dict[str, Any]]) -> str:
    """Deterministic answer: grounded sentences first, then the one unsupported claim.

    Asked to rewrite an answer (TruthLens standard mode), it behaves like a model that takes the
    correction: the grounded sentences only, without the unsupported claim.
    """
    question = last_user = ""
    grounding: list[str] = []
    for m in messages:
        role, text = m.get("role"), _text(m.get("content"))
        if role == "user":
            docs, question = _grounding_rules().split(text)
            grounding += docs
            last_user = text
        elif role == "system":  # its documents when it has a document layout, else all of it
            docs, _ = _grounding_rules().split(text, question=False)
            grounding += docs or [text]
        elif role in ("tool", "function"):
            grounding.append(text)
    context = " ".join(g.strip() for g in grounding if g.strip())
    refine = REFINE_MARKER in last_user
    if context:
        sentences = re.split(r"(?<=[.!?])\s+", context)
        grounded = " ".join(sentences[:2]).strip()
        return grounded if refine else grounded + " " + INJECTED_CLAIM
    if refine:
        return "The provided context does not contain this information."
    low = question.lower()
    for subject, fact in KNOWN_FACTS.items():
        if subject in low:
            return f"{fact} {INJECTED_CLAIM}"
    q = question.strip().rstrip("?.! ") or "your question"
    return f"Here is a short answer about {q[:160]}. {INJECTED_CLAIM}"


def completion_json(answer: str, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-demo",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": len(answer.split()), "total_tokens": 0},
    }


def completion_sse_chunks(answer: str, model: str, words_per_chunk: int = 3) -> list[bytes]:
    """The answer as chat.completion.chunk events, then [DONE], one SSE event per element."""

    def event(delta: dict[str, Any], finish: str | None) -> bytes:
        chunk = {
            "id": "chatcmpl-demo",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    words = answer.split(" ")
    pieces = [" ".join(words[i : i + words_per_chunk]) for i in range(0, len(words), words_per_chunk)]
    out = [event({"role": "assistant", "content": ""}, None)]
    for i, p in enumerate(pieces):
        out.append(event({"content": p if i == 0 else " " + p}, None))
    out.append(event({}, "stop"))
    out.append(b"data: [DONE]\n\n")
    return out


class DemoUpstreamServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], scripts: dict[str, Script] | None = None,
                 chunk_delay_s: float = 0.02, record: bool = True) -> None:
        super().__init__(address, _Handler)
        self.scripts: dict[str, Script] = dict(scripts or {})
        self.chunk_delay_s = chunk_delay_s
        self.record = record
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}"

    def add_record(self, req: RecordedRequest) -> None:
        if self.record:
            with self._lock:
                self.requests.append(req)
                del self.requests[:-1000]  # a bounded log: the benchmark sends many requests

    def start_background(self) -> DemoUpstreamServer:
        self._thread = threading.Thread(target=self.serve_forever, name="demo-upstream", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real LLM server behind Envoy
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall
    server: DemoUpstreamServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return None

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    def _record(self, body: bytes) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.add_record(RecordedRequest(self.command, self.path, headers, body))

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._record(b"")
        name = self._script_name()
        if name:
            return self._send_script(name)
        if self.path.split("?")[0] == "/v1/models":
            body = {"object": "list", "data": [{"id": DEMO_MODEL, "object": "model", "owned_by": "truthlens"}]}
            return self._send(200, "application/json", json.dumps(body).encode())
        if self.path == "/healthz":
            return self._send(200, "text/plain", b"ok")
        self._send(404, "application/json", b'{"error":{"message":"not found"}}')

    def _script_name(self) -> str | None:
        """`x-demo-script: NAME`, or a path starting /script/NAME/ (for clients without custom headers)."""
        if self.path.startswith("/script/"):
            return self.path.split("/")[2]
        return self.headers.get(SCRIPT_HEADER)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = self._read_body()
        self._record(body)
        name = self._script_name()
        if name:
            return self._send_script(name)
        if self.path.split("?")[0] != "/v1/chat/completions":
            return self._send(404, "application/json", b'{"error":{"message":"not found"}}')
        try:
            req = json.loads(body)
            messages = req["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise TypeError("messages must be a list of objects")
        except (ValueError, KeyError, TypeError):
            return self._send(400, "application/json", b'{"error":{"message":"invalid request body"}}')
        answer = demo_answer(messages)
        model = str(req.get("model") or DEMO_MODEL)
        if req.get("stream"):
            return self._send_chunks(200, "text/event-stream", completion_sse_chunks(answer, model),
                                     self.server.chunk_delay_s)
        self._send(200, "application/json", json.dumps(completion_json(answer, model)).encode())

    def _send_script(self, name: str) -> None:
        script = self.server.scripts.get(name)
        if script is None:
            return self._send(500, "text/plain", f"unknown script {name}".encode())
        extra = dict(script.headers)
        if script.chunks is not None:
            if script.gzip:  # one gzip stream split at the scripted chunk boundaries' sizes
                whole = gzip_lib.compress(b"".join(script.chunks))
                half = len(whole) // 2
                chunks = [whole[:half], whole[half:]]
                extra["content-encoding"] = "gzip"
            else:
                chunks = script.chunks
            return self._send_chunks(script.status, script.content_type, chunks, script.delay_s, extra)
        body = script.body
        if script.gzip:
            body = gzip_lib.compress(body)
            extra["content-encoding"] = "gzip"
        self._send(script.status, script.content_type, body, extra)

    def _send(self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _send_chunks(self, status: int, content_type: str, chunks: list[bytes], delay_s: float,
                     extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        for i, chunk in enumerate(chunks):
            if i and delay_s:
                time.sleep(delay_s)
            if chunk:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def load_scripts(path: str | Path) -> dict[str, Script]:
    """A JSON file {name: {status, content_type, body | chunks, gzip, delay_ms, headers}}."""
    data = json.loads(Path(path).read_text())
    return {str(k): Script.from_json(v) for k, v in data.items()}


def start_demo_upstream(host: str = "127.0.0.1", port: int = 0, scripts: dict[str, Script] | None = None,
                        chunk_delay_s: float = 0.02, record: bool = True) -> DemoUpstreamServer:
    """Bind (port 0 = a free port) and serve on a daemon thread."""
    return DemoUpstreamServer((host, port), scripts, chunk_delay_s, record).start_background()


def main(argv: list[str] | None = None) -> int:
    """`python -m extproc.devtools.demo_upstream --port 8000 [--scripts FILE]`: serve until Ctrl-C/SIGTERM."""
    import argparse
    import signal

    p = argparse.ArgumentParser(description="TruthLens demo OpenAI-compatible upstream")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--scripts", default=None, help="JSON file of scripted replies (x-demo-script: NAME)")
    p.add_argument("--chunk-delay-ms", type=float, default=20.0)
    p.add_argument("--no-record", action="store_true", help="do not keep a log of received requests")
    args = p.parse_args(argv)
    server = DemoUpstreamServer((args.host, args.port), load_scripts(args.scripts) if args.scripts else None,
                                args.chunk_delay_ms / 1000.0, record=not args.no_record)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"demo upstream on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
