"""RequestContext: what the request taught the sidecar, read by the response phase and by mitigation.

Owned by one ChatExchange (extproc.gateway.exchange), itself referenced only by its stream's
handler: when the stream ends for any reason (done, client gone, Envoy reset) both are garbage.
There is deliberately no registry keyed by request id, so nothing can leak.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from extproc.inference.api import DetectionResult
from extproc.policy.decisions import Decision
from extproc.protocol.envoy import header_text, headers_dict


@dataclass(slots=True)
class RequestContext:
    method: str = ""
    path: str = ""
    # The request headers as Envoy sent them (ext_proc HttpHeaders). Decoded into a dict only when
    # something reads `request_headers` or `request_id`: on the common path nothing does.
    http_headers: Any = None
    started: float = field(default_factory=time.perf_counter)
    decision: Decision | None = None  # chosen by policy in the request phase
    question: str | None = None
    system_prompt: str | None = None
    grounding: tuple[str, ...] = ()
    request_body: bytes | None = None  # the upstream request, kept only for standard/premium modes
    answers: tuple[str | None, ...] = ()  # per choice position, as judged
    choice_results: dict[int, DetectionResult] = field(default_factory=dict)  # by answer position
    timings_ms: dict[str, float] = field(default_factory=dict)  # stage -> time TruthLens spent on it
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

    @property
    def spent_ms(self) -> float:
        """The time TruthLens added to this request so far (what verdicts report as latency)."""
        return sum(self.timings_ms.values())
