"""Every ext_proc reply the gateway sends that does not carry a judged answer, built in one place.

Most requests are answered with a handful of prebuilt messages (continue, pass-through, the
chat request's header reply) or with an early verdict's reply, which is shared across requests
when it took under a millisecond. Shared messages are never mutated.
"""

from __future__ import annotations

from typing import Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.policy.actions import Headers, latency_header_value
from extproc.policy.decisions import Decision
from extproc.policy.verdict import Verdict
from extproc.protocol import envoy as ev
from extproc.protocol.openai import error_body

FORCE_IDENTITY = (("accept-encoding", "identity"),)  # we must be able to read the answer
NO_RESPONSE_BODY_MODE = ev.processing_mode(response_body=ev.ProcessingMode.NONE)  # verdict known: body not needed
PASSTHROUGH_REPLY = ev.request_headers_response(mode_override=ev.SKIP_REST_MODE)
CHAT_REQUEST_REPLY = ev.request_headers_response(FORCE_IDENTITY)
# Early-verdict replies shared across requests: only for sub-millisecond verdicts, whose latency
# header takes one of ten values, and at most this many.
SHARED_REPLY_MAX_MS = 1.0
SHARED_REPLIES_MAX = 1024

_CONTINUE = {
    "request_headers": ev.request_headers_response(),
    "request_body": ev.request_body_response(None),
    "response_headers": ev.response_headers_response(),
    "response_body": ev.response_body_response(None),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    "response_trailers": pb.ProcessingResponse(response_trailers=pb.TrailersResponse()),
}


def continue_reply(phase: str) -> pb.ProcessingResponse:
    """'Go on unchanged' for any phase (shared prebuilt messages: never mutate them)."""
    return _CONTINUE[phase]


def refusal(status: int, message: str, param: str | None, code: str, headers: Headers = (),
            error_type: str = "invalid_request_error") -> pb.ProcessingResponse:
    """Answer the client at once with an OpenAI-style error (`param` names the offending field);
    the request never reaches the upstream."""
    body = error_body(message, type=error_type, code=code, param=param)
    return ev.immediate_response(status, (("content-type", "application/json"), *headers), body)


def verdict_headers_reply(phase: str, headers: Headers) -> pb.ProcessingResponse:
    """Pass the body on unchanged, set the verdict headers (a failed phase, a verdict known early)."""
    if phase == "response_headers":
        return ev.response_headers_response(headers, (), NO_RESPONSE_BODY_MODE)
    return ev.response_body_response(None, headers)


class EarlyReplies:
    """The replies for verdicts fixed before the answer: most requests end with one of these.

    A verdict settled in the request phase added well under a millisecond, so its reply (latency
    header included, one decimal) is one of a handful per (status, decision): those are built
    once and shared like the prebuilt "continue" replies. Slower ones (the sentinel model ran)
    are built per request. Only for early verdicts: the key leaves out score and spans, which
    such verdicts never have. One per sidecar process.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[object, ...], tuple[Decision, pb.ProcessingResponse]] = {}

    def get(self, verdict: Verdict, decision: Decision, headers: Callable[[], Headers]) -> pb.ProcessingResponse:
        """`headers` builds the verdict's header set, called only when no shared reply fits."""
        if verdict.latency_ms >= SHARED_REPLY_MAX_MS:
            return verdict_headers_reply("response_headers", headers())
        latency = latency_header_value(verdict.latency_ms)
        # Decisions are the policy's long-lived objects: their id is a cheap key (hashing the
        # frozen dataclass costs more than building the key), the stored object guards reuse.
        key = (verdict.status, verdict.reason, id(decision), latency)
        cached = self._cache.get(key)
        if cached is not None and cached[0] is decision:
            return cached[1]
        reply = verdict_headers_reply("response_headers", headers())
        if len(self._cache) < SHARED_REPLIES_MAX:
            self._cache[key] = (decision, reply)
        return reply
