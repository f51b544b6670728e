"""RequestContext: everything one HTTP request teaches the sidecar, from request headers to the
last response chunk.

One object per ext_proc gRPC stream, created when request headers arrive and referenced only by
the stream handler's local variable: when the stream ends for any reason (done, client gone,
Envoy reset) the object is garbage. There is deliberately no registry keyed by request id, so
nothing can leak.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from extproc.inference.api import DetectionResult, SentinelResult
from extproc.protocol.envoy import header_text, headers_dict


class Route(Enum):
    """What the gateway does with this request, decided as early as possible."""

    PASSTHROUGH = "passthrough"  # not a chat completion: no body work, no verdict headers
    CHAT = "chat"  # judged (or explicitly marked) chat completion


class BodyKind(Enum):
    UNKNOWN = "unknown"
    JSON = "json"  # buffered chat.completion
    SSE = "sse"  # streamed chat.completion.chunk events
    BUFFERED_SSE = "buffered_sse"  # stream buffered whole (action=block needs the full answer)
    OTHER = "other"


@dataclass(slots=True)
class RequestContext:
    method: str = ""
    path: str = ""
    # The request headers as Envoy sent them (ext_proc HttpHeaders). Decoded into a dict only when
    # something reads `request_headers` or `request_id`: on the common path nothing does.
    http_headers: Any = None
    route: Route = Route.PASSTHROUGH
    started: float = field(default_factory=time.perf_counter)

    # policy
    decision: Any = None  # extproc.policy.decisions.Decision (name, enabled, mode, action, threshold)
    # request body
    request_done: bool = False  # the request body phase finished (else the verdict is unchecked/error)
    # Our last reply told Envoy to send nothing more (SKIP_REST, or the verdict was fixed before the
    # answer and the response body is not wanted): the stream can end without waiting for Envoy.
    exchange_done: bool = False
    question: str | None = None
    system_prompt: str | None = None
    grounding: tuple[str, ...] = ()
    stream_requested: bool = False
    request_body: bytes | None = None  # the upstream request, kept only for standard/premium modes
    model: str | None = None
    sentinel: SentinelResult | None = None
    sentinel_task: asyncio.Task[None] | None = None  # runs while the request is with the LLM
    sentinel_ms: float = 0.0  # compute time (overlapped with the upstream, so not "added" latency)
    ungrounded_reason: str | None = None  # set when the request has no grounding (-> unverified)
    # a status fixed before the response arrives (disabled, skipped, unverified, unchecked)
    early_status: str | None = None
    early_reason: str | None = None
    # response
    response_status: int = 0
    content_type: str = ""
    content_encoding: str = ""
    body_kind: BodyKind = BodyKind.UNKNOWN
    sse: Any = None  # extproc.protocol.sse assembler while streaming
    sse_held: bytes = b""  # bytes of an SSE frame split across chunks, forwarded once complete
    sse_done: bool = False  # verdict event already emitted
    answers: tuple[str | None, ...] = ()  # per choice position, as judged
    detection: DetectionResult | None = None  # the worst choice's result
    choice_results: dict[int, DetectionResult] = field(default_factory=dict)  # by answer position
    iterations: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    verdict: Any = None  # extproc.policy.verdict.Verdict once decided
    _headers: dict[str, str] | None = None
    _request_id: str | None = None

    @classmethod
    def from_http(cls, http: Any) -> RequestContext:
        """From request headers: method and path now, everything else on first use.

        Envoy sends the pseudo-headers first, so this reads a handful of entries instead of
        decoding every header of every request; any other order falls back to the full dict.
        """
        method = path = ""
        for header in http.headers.headers:
            key = header.key
            if key == ":method":
                method = header_text(header)
            elif key == ":path":
                path = header_text(header)
            elif not key.startswith(":"):
                break
            if method and path:
                return cls(method=method, path=path, http_headers=http)
        ctx = cls(http_headers=http)
        ctx.method, ctx.path = ctx.request_headers.get(":method", ""), ctx.request_headers.get(":path", "")
        return ctx

    @classmethod
    def from_headers(cls, headers: dict[str, str]) -> RequestContext:
        """From an already decoded header dict (tests, tools)."""
        return cls(method=headers.get(":method", ""), path=headers.get(":path", ""), _headers=headers)

    @property
    def request_headers(self) -> dict[str, str]:
        """Lower-case name -> value (see extproc.protocol.envoy.headers_dict), decoded once."""
        if self._headers is None:
            self._headers = headers_dict(self.http_headers) if self.http_headers is not None else {}
        return self._headers

    @property
    def request_id(self) -> str:
        """Envoy's x-request-id (a fresh id when there is none), read on first use: logs, mitigation."""
        if self._request_id is None:
            self._request_id = self.request_headers.get("x-request-id") or uuid.uuid4().hex
        return self._request_id

    def mark(self, stage: str, since: float) -> float:
        """Record the time spent in `stage` (ms) since perf_counter value `since`; returns now."""
        now = time.perf_counter()
        self.timings_ms[stage] = self.timings_ms.get(stage, 0.0) + (now - since) * 1000.0
        return now

    def fix_status(self, status: str, reason: str | None = None) -> None:
        """The verdict is decided before the response: no response body work is needed."""
        if self.early_status is None:
            self.early_status = status
            self.early_reason = reason

    def cancel_pending(self) -> None:
        """The stream ended early: stop work nobody will read."""
        if self.sentinel_task is not None and not self.sentinel_task.done():
            self.sentinel_task.cancel()
        self.sentinel_task = None

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0
