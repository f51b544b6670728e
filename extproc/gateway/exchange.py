"""ChatExchange: the processor of one ext_proc stream, i.e. of one HTTP request through Envoy.

Created when the request headers arrive, it owns everything the exchange learns as typed
fields and has one method per phase; the stream loop (extproc.gateway.service) only calls them
and writes their replies.

Request side: strip spoofed verdict headers, force `accept-encoding: identity`, choose the
decision, extract question + grounding, drop the RAG field, start the sentinel (it runs while the
request is with the LLM and is awaited when the response headers arrive). Everything that fixes
the verdict before the answer exists (disabled, skipped, unverified, unchecked) is put on the
response headers, and the response body is then not even sent to us (mode override NONE).

Response side: JSON is judged whole (BUFFERED). SSE is switched to STREAMED and forwarded as it
comes; when `[DONE]` (or the end of the stream) arrives the assembled answer is judged and that
chunk becomes [warning delta per flagged choice] + verdict event + `[DONE]`. The verdict event
is a `chat.completion.chunk` with `choices: []` and a `truthlens` object, so OpenAI SDK clients
parse it like any chunk. action=block cannot recall bytes already sent, so a stream whose
decision blocks is buffered whole instead. Whatever cannot be judged passes through
byte-identical, marked unchecked with a reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from enum import Enum
from typing import TYPE_CHECKING, Sequence

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.gateway import replies
from extproc.gateway.context import RequestContext
from extproc.gateway.sentinel import SentinelCall
from extproc.gateway.streaming import SseStream, StreamOutcome
from extproc.gateway.upstream_logprobs import UpstreamLogprobs
from extproc.inference.api import (
    MAX_CHARS_PER_TOKEN,
    DetectionResult,
    InferenceError,
    ModelUnavailable,
    Overloaded,
    TooLarge,
)
from extproc.inference.templates import sentinel_prompt
from extproc.policy.actions import ActionPlan, plan_actions, streaming_headers
from extproc.policy.decisions import Decision
from extproc.policy.verdict import (
    Status,
    UncheckedReason,
    UnverifiedReason,
    Verdict,
    early_verdict,
    verdict_payload,
    worst_choice_verdict,
)
from extproc.protocol import envoy as ev
from extproc.protocol.encoding import BodyTooLarge, EncodingError, decode_body
from extproc.protocol.openai import (
    ProtocolError,
    RagFieldError,
    append_to_choices,
    parse_chat_request,
    parse_chat_response,
)
from extproc.protocol.paths import is_chat_path
from extproc.protocol.sse import DONE_EVENT, ChatStreamRelay, content_delta_chunk, finish_chunk, verdict_chunk
from extproc.telemetry.tracing import stage

if TYPE_CHECKING:  # typing only: the runtime is built above this module
    from extproc.gateway.wiring import GatewayRuntime

log = logging.getLogger("truthlens.exchange")

JSON_TYPES = ("application/json",)
SSE_TYPE = "text/event-stream"
# Sentence checks of one stream running at once: enough to keep up with a token stream (a sentence takes
# tens of ms), few enough that one long fast stream cannot fill the batchers' max_queue for everyone.
STREAM_CHECKS_IN_FLIGHT = 4


class Route(Enum):
    """What the gateway does with this request, decided as early as possible."""

    PASSTHROUGH = "passthrough"  # not a chat completion: no body work, no verdict headers
    CHAT = "chat"  # judged (or explicitly marked) chat completion


class BodyKind(Enum):
    UNKNOWN = "unknown"
    JSON = "json"  # buffered chat.completion
    SSE = "sse"  # streamed chat.completion.chunk events
    BUFFERED_SSE = "buffered_sse"  # stream buffered whole (action=block needs the full answer)


def is_chat_route(method: str, path: str) -> bool:
    """Every spelling of POST .../chat/completions an upstream might route to the chat API (protocol/paths.py)."""
    return (method == "POST" or method.upper() == "POST") and is_chat_path(path)


class ChatExchange:
    """One request's processor. Not shared: every field belongs to this exchange alone."""

    __slots__ = ("rt", "tl", "early_replies", "ctx", "route", "done", "request_done", "sentinel", "ungrounded_reason", "early_status", "early_reason", "content_encoding", "body_kind",
                 "stream", "verdict", "rag_in_body", "logprobs", "_stream_slots", "_stream_error")

    def __init__(self, rt: GatewayRuntime, early_replies: replies.EarlyReplies, http: pb.HttpHeaders) -> None:
        self.rt = rt
        self.tl = rt.config.truthlens
        self.early_replies = early_replies
        self.ctx = RequestContext.from_http(http)
        self.route = Route.PASSTHROUGH
        # Our last reply told Envoy to send nothing more (SKIP_REST, or the verdict was fixed before the
        # answer and the response body is not wanted): the stream can end without waiting for Envoy.
        self.done = False
        self.request_done = False  # the request body phase finished (else the verdict is unchecked/error)
        self.sentinel = SentinelCall()  # does the prompt need a check (extproc.gateway.sentinel)
        self.ungrounded_reason: UnverifiedReason | None = None  # the request has no grounding
        # a status fixed before the response arrives (disabled, skipped, unverified, unchecked)
        self.early_status: Status | None = None
        self.early_reason: str | None = None
        self.content_encoding = ""
        self.body_kind = BodyKind.UNKNOWN
        self.stream: SseStream | None = None  # the streamed answer's judge (extproc.gateway.streaming)
        self._stream_slots: asyncio.Semaphore | None = None  # its sentence checks running at once
        self._stream_error: BaseException | None = None  # a sentence check failed: the verdict is settled
        self.verdict: Verdict | None = None
        self.rag_in_body = False  # the request body holds the RAG field's name: it must not go upstream as is
        self.logprobs: UpstreamLogprobs | None = None  # the upstream's own logprobs, when the decision wants them

    # ---- request headers ------------------------------------------------------------------

    def request_headers(self, http: pb.HttpHeaders) -> pb.ProcessingResponse:
        ctx = self.ctx
        spoofed = ev.truthlens_header_names(http)
        if not is_chat_route(ctx.method, ctx.path) or http.end_of_stream:
            # Not ours to judge: no body, no response work, no verdict headers.
            self.done = True
            if not spoofed:
                return replies.PASSTHROUGH_REPLY
            return ev.request_headers_response(remove_headers=spoofed, mode_override=ev.SKIP_REST_MODE)
        self.route = Route.CHAT
        if not self.rt.policy.uses_question:
            self._decide(None)
        return ev.request_headers_response(replies.FORCE_IDENTITY, spoofed) if spoofed else replies.CHAT_REQUEST_REPLY

    # ---- request body ---------------------------------------------------------------------

    def request_body(self, http: pb.HttpBody) -> pb.ProcessingResponse:
        """Synchronous: nothing here waits (the sentinel model, when needed, runs as a task)."""
        t0 = time.perf_counter()
        ctx, body = self.ctx, http.body
        rag_field = self.tl.rag_context_field or None
        # The RAG field must never reach the upstream: removed, or the request refused (docs/gateway.md).
        self.rag_in_body = rag_field is not None and rag_field.encode() in body
        if len(body) > self.tl.max_body_bytes:
            if self.rag_in_body:  # too large to parse and rewrite: refuse rather than forward it
                return self._refuse(413, UncheckedReason.TOO_LARGE, f"the request body is over {self.tl.max_body_bytes} "
                                    f"bytes and carries '{rag_field}', which the gateway must remove", rag_field,
                                    "request_too_large")
            return self._request_unchecked(UncheckedReason.TOO_LARGE)
        try:
            chat = parse_chat_request(body, rag_field, self.rt.grounding)
        except RagFieldError as exc:
            return self._refuse(400, UncheckedReason.BAD_JSON, str(exc), exc.field, "invalid_truthlens_context")
        except ProtocolError as exc:
            log.info("request %s: not a judgeable chat request: %s", ctx.request_id, exc)
            if exc.upstream_body is not None:  # the field was removed before the error was found
                return self._request_unchecked(UncheckedReason.BAD_JSON, exc.upstream_body)
            if self.rag_in_body and not exc.object_read:  # not a JSON object: the field cannot be removed
                return self._refuse(400, UncheckedReason.BAD_JSON, f"the request body is not a JSON object ({exc}) "
                                    f"and carries '{rag_field}', which the gateway must remove", rag_field,
                                    "invalid_json")
            if rag_field is not None and self._compressed_request_carries(body, rag_field):
                return self._refuse(400, UncheckedReason.BAD_JSON, f"a compressed request body cannot carry "
                                    f"'{rag_field}' (the gateway must remove it): send the request uncompressed",
                                    rag_field, "compressed_truthlens_context")
            return self._request_unchecked(UncheckedReason.BAD_JSON)
        ctx.question, ctx.system_prompt, ctx.grounding = chat.question, chat.system_prompt, chat.context
        decision = self._decide(chat.question)
        upstream_body = chat.upstream_body
        if decision.enabled and decision.upstream_logprobs:
            self.logprobs = UpstreamLogprobs()
            asked = self.logprobs.request(upstream_body or body, self.tl.signals.upstream_top_logprobs)
            upstream_body = asked or upstream_body  # we asked: they come out of the answer again
        reply = ev.request_body_response(upstream_body)
        if decision.mode != "lightweight":  # standard/premium re-ask with the original messages
            ctx.request_body = chat.upstream_body or body
        if not decision.enabled:
            self._fix_status(Status.DISABLED)
        else:
            if not chat.grounded:
                self.ungrounded_reason = UnverifiedReason.TOOLS_WITHOUT_RESULTS \
                    if chat.has_tools and not chat.has_tool_results else UnverifiedReason.NO_CONTEXT
            self._start_sentinel()
        ctx.mark("request", t0)
        self.request_done = True
        return reply

    def _compressed_request_carries(self, body: bytes, rag_field: str) -> bool:
        """The client compressed the request (rare: OpenAI clients do not) and the RAG field is inside.

        Decoded on the loop, capped at the gRPC message size: it runs only for a request body that is
        not JSON and says it is compressed. Undecodable bodies are forwarded (the upstream cannot read
        them either), and so are ones whose decoded form is over the cap (docs/gateway.md)."""
        coding = self.ctx.request_headers.get("content-encoding", "").strip().lower()
        if coding in ("", "identity"):
            return False
        try:
            return rag_field.encode() in decode_body(body, coding, self.rt.config.server.max_message_bytes)
        except EncodingError:
            return False

    def _request_unchecked(self, reason: UncheckedReason, body: bytes | None = None) -> pb.ProcessingResponse:
        """Not judged; `body`: forward this instead (the original without the RAG field)."""
        self._decide(None)
        self._fix_status(Status.UNCHECKED, reason)
        self.request_done = True
        return ev.request_body_response(body) if body is not None else replies.continue_reply("request_body")

    def _refuse(self, status: int, reason: UncheckedReason, message: str, param: str | None,
                code: str) -> pb.ProcessingResponse:
        """Answer the client now with an OpenAI-style error naming `param`; nothing goes upstream."""
        self._decide(None)
        self._fix_status(Status.UNCHECKED, reason)
        self.request_done = self.done = True  # Envoy sends nothing more on this stream
        self.verdict = Verdict.unchecked(self._decision, reason, latency_ms=self.ctx.spent_ms)
        log.info("request %s: refused (%d): %s", self.ctx.request_id, status, message)
        return replies.refusal(status, message, param, code, self._plan(self.verdict).headers)

    def _decide(self, question: str | None) -> Decision:
        policy, ctx = self.rt.policy, self.ctx
        if ctx.decision is None or policy.uses_question:
            # Without configured decisions the default applies: the headers are never decoded.
            ctx.decision = policy.decide(ctx.request_headers, question) if policy.has_decisions else policy.default
        return ctx.decision

    def _fix_status(self, status: Status, reason: str | None = None) -> None:
        """The verdict is decided before the response: no response body work is needed."""
        if self.early_status is None:
            self.early_status, self.early_reason = status, reason

    # ---- sentinel -------------------------------------------------------------------------

    def _start_sentinel(self) -> None:
        if self.ctx.grounding and self._decision.check_when_grounded:
            # Documents came with the request: the answer is checked whatever the prompt looks like
            # (no sentinel, so no "non-factual -> skipped").
            self._settle()
            return
        if not self.ctx.question or not self.rt.engine.has("sentinel"):
            self._settle()
            return
        # The verdict needs the sentinel only when the answer arrives: unless the prefilter is sure now,
        # the model classifies while the request is with the LLM instead of holding the request for it.
        if self.sentinel.start(self.rt.engine, self._sentinel_prompt(), self.rt.inference_timeout_s,
                               self._decision.mode, self.ctx.request_id):
            self._settle()

    def _sentinel_prompt(self) -> str:
        ctx = self.ctx
        if ctx.grounding:  # the system prompt may hold documents: the sentinel judges the question alone
            return ctx.question or ""
        return sentinel_prompt(ctx.question or "", ctx.system_prompt, self.tl.sentinel_include_system_prompt)

    @property
    def sentinel_pending(self) -> bool:
        """The sentinel still runs: `await_sentinel` before `response_headers`."""
        return self.sentinel.pending

    async def await_sentinel(self) -> None:
        t0 = time.perf_counter()
        await self.sentinel.wait()
        self.ctx.mark("sentinel_wait", t0)  # what the client waited for it: the time TruthLens added
        self._settle()

    def _settle(self) -> None:
        """Everything the request teaches, in order: sentinel verdict, grounding, detector."""
        if self.sentinel.overloaded:
            self._fix_status(Status.UNCHECKED, UncheckedReason.OVERLOADED)
        s = self.sentinel.result
        if s is not None and not s.needs_check:
            self._fix_status(Status.SKIPPED)
        if self.ungrounded_reason is not None:
            self._fix_status(Status.UNVERIFIED, self.ungrounded_reason)
        if not self.rt.engine.has("detector"):
            self._fix_status(Status.UNCHECKED, UncheckedReason.MODELS_UNAVAILABLE)

    def cancel_pending(self) -> None:
        """The stream ended early: stop work nobody will read."""
        self.sentinel.cancel()
        if self.stream is not None:
            self.stream.cancel()

    # ---- response headers -------------------------------------------------------------------

    def response_headers(self, http: pb.HttpHeaders) -> pb.ProcessingResponse:
        """Once the sentinel is settled (`await_sentinel`): JSON or SSE, or a verdict fixed already."""
        if not self.request_done:  # the request body phase never finished (a bug of ours): say so
            self._decide(None)
            self._fix_status(Status.UNCHECKED, UncheckedReason.ERROR)
        if self.early_status is not None:
            # The verdict was fixed before the answer: of these headers only forged verdict
            # headers matter (an upstream cannot forge a verdict either), so no values are decoded.
            spoofed = ev.truthlens_header_names(http)
        else:
            headers = ev.headers_dict(http)
            spoofed = ev.truthlens_header_names(headers)
            reply = self._choose_body_handling(http, headers, spoofed)
            if reply is not None:
                return reply
        decision = self._decision
        self.verdict = verdict = early_verdict(decision, self.early_status, self.early_reason, self.ctx.spent_ms)
        self.done = True  # NO_RESPONSE_BODY_MODE: the body never comes (trailers are never asked for)
        if spoofed:
            return ev.response_headers_response(self._plan(verdict).headers, spoofed, replies.NO_RESPONSE_BODY_MODE)
        return self.early_replies.get(verdict, decision, lambda: self._plan(verdict).headers)

    def _choose_body_handling(self, http: pb.HttpHeaders, headers: dict[str, str],
                              spoofed: tuple[str, ...]) -> pb.ProcessingResponse | None:
        """The reply that asks for the body (JSON, SSE), or None when the status is now fixed."""
        status = int(headers.get(":status", "0") or 0)
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        self.content_encoding = headers.get("content-encoding", "").strip().lower()
        action = self._decision.action
        if not 200 <= status < 300:
            self._fix_status(Status.UNCHECKED, UncheckedReason.UPSTREAM_ERROR)
        elif http.end_of_stream:
            self._fix_status(Status.UNCHECKED, UncheckedReason.NO_ANSWER)
        elif content_type in JSON_TYPES:
            self.body_kind = BodyKind.JSON
            return ev.response_headers_response((), spoofed)
        elif content_type == SSE_TYPE and self.content_encoding in ("", "identity"):
            d = self._decision
            hold_back = d.hold_back == "sentence"
            if action == "block" and not hold_back:
                # Blocking needs the whole answer before the client sees any of it.
                self.body_kind = BodyKind.BUFFERED_SSE
                return ev.response_headers_response((), spoofed)
            self.body_kind = BodyKind.SSE
            self.stream = SseStream(self._check_sentence, self._stream_closing, hold_back=hold_back,
                                    early_stop=action == "block", threshold=d.threshold,
                                    max_hold_chars=self.tl.stream.max_hold_chars,
                                    max_answer_chars=self._stream_answer_chars(),
                                    on_event=self.logprobs.read_event if self.logprobs else None,
                                    rewrite=self.logprobs.event_rewrite() if self.logprobs else None)
            early = () if action == "none" else streaming_headers(self._decision)
            # STREAMED: chunks reach us as they arrive; the builder also drops content-length
            return ev.response_headers_response(early, spoofed, ev.STREAMED_RESPONSE_MODE)
        else:
            self._fix_status(Status.UNCHECKED, UncheckedReason.UNSUPPORTED_CONTENT)
        return None

    # ---- response body ----------------------------------------------------------------------

    def mitigation_budget_s(self) -> float:
        """Seconds a standard/premium re-ask may need for this body (0: none): the stream loop asks
        Envoy for that much message time before `response_body` starts."""
        if self.body_kind is not BodyKind.JSON or not self._wants_mitigation():
            return 0.0
        return self.rt.mitigator.budget_s(self._decision.mode)

    async def response_body(self, http: pb.HttpBody) -> list[pb.ProcessingResponse]:
        """The replies this body message lets go: one for a buffered body; for a stream, one per chunk that can
        be answered now (none while Envoy holds the chunk for us, several when held chunks are released)."""
        kind = self.body_kind
        if kind is BodyKind.SSE and self.stream is not None:
            outs = await self.stream.feed(http.body, http.end_of_stream)
            return [ev.streamed_chunk_response(out) for out in outs]
        if kind is BodyKind.JSON:
            return [await self._json_body(http.body)]
        if kind is BodyKind.BUFFERED_SSE:
            return [await self._buffered_sse(http.body)]
        return [replies.continue_reply("response_body")]

    async def _json_body(self, body: bytes) -> pb.ProcessingResponse:
        verdict, text = await self._judge_json(body)
        self.verdict = verdict
        new_body: bytes | None = None
        if text is not None and verdict.actionable and self._wants_mitigation():
            self.verdict, new_body = await self.rt.mitigator.mitigate(self.ctx, text, verdict)
        if text is not None and self.logprobs is not None:  # read by _judge_json
            self.verdict = self._with_upstream(self.verdict)
            stripped = self.logprobs.strip(new_body or text)
            new_body = stripped if stripped != (new_body or text) else new_body
        plan = self._plan(self.verdict)
        if plan.block is not None:
            return ev.immediate_response(plan.block.status, plan.block.headers, plan.block.body)
        if plan.warning and text is not None:
            flagged = self._flagged(self.ctx.choice_results)
            new_body = append_to_choices(new_body or text, {i: plan.warning for i in flagged} or plan.warning)
        if new_body is None:
            return ev.response_body_response(None, plan.headers)
        # a body we re-serialized from its decoded form no longer carries the upstream's encoding
        removed = ["content-encoding"] if self.content_encoding not in ("", "identity") else []
        return ev.response_body_response(new_body, plan.headers, removed)

    async def _judge_json(self, body: bytes) -> tuple[Verdict, bytes | None]:
        """Verdict and the decoded body (None when it could not be judged)."""
        reason: UncheckedReason | None = None
        if len(body) > self.tl.max_body_bytes:
            reason = UncheckedReason.TOO_LARGE
        else:
            try:
                if self.content_encoding in ("", "identity"):
                    text = decode_body(body, self.content_encoding, self.tl.max_body_bytes)
                else:  # decompression is CPU work (capped, but up to max_body_bytes): off the event loop
                    text = await asyncio.to_thread(decode_body, body, self.content_encoding, self.tl.max_body_bytes)
                # on the loop: the parse is C holding the GIL, so a worker thread would not shorten the loop's stall
                # (measured for a 4 MB answer: ~14 ms either way); max_body_bytes bounds it
                answers = parse_chat_response(text).answers
            except BodyTooLarge:
                reason = UncheckedReason.TOO_LARGE
            except EncodingError:
                reason = UncheckedReason.UNSUPPORTED_CONTENT
            except ProtocolError:
                reason = UncheckedReason.BAD_JSON
        if reason is not None:
            return Verdict.unchecked(self._decision, reason, latency_ms=self.ctx.spent_ms), None
        if self.logprobs is not None:
            self.logprobs.read(text)  # before judging: the writer fusion stacks them into the scores
        verdict, _ = await self._judge(answers)
        return verdict, text

    async def _buffered_sse(self, body: bytes) -> pb.ProcessingResponse:
        """action=block on a stream: the whole event stream was buffered; judge, then block or annotate."""
        if len(body) > self.tl.max_body_bytes:
            self.verdict = Verdict.unchecked(self._decision, UncheckedReason.TOO_LARGE, latency_ms=self.ctx.spent_ms)
            return ev.response_body_response(None, self._plan(self.verdict).headers)
        relay = ChatStreamRelay()
        head = relay.feed(body)
        tail = await self._stream_tail(relay)
        plan = self._plan(self.verdict)
        if plan.block is not None:
            return ev.immediate_response(plan.block.status, plan.block.headers, plan.block.body)
        return ev.response_body_response(head + relay.finish(tail), plan.headers)

    async def _stream_tail(self, relay: ChatStreamRelay) -> bytes:
        """[warning delta per flagged choice] + verdict event, inserted before [DONE]."""
        a = relay.assembler
        indices = a.indices()
        self.verdict, results = await self._judge([a.text(i) for i in indices])
        if self._decision.action == "none":
            return b""
        plan = self._plan(self.verdict)
        out = b""
        if plan.warning:
            for pos in self._flagged(results):
                out += content_delta_chunk(indices[pos], plan.warning, id=a.id, model=a.model, created=a.created)
        return out + verdict_chunk(verdict_payload(self.verdict), id=a.id, model=a.model, created=a.created)

    def _stream_answer_chars(self) -> int:
        """What a stream may carry and still be judged: max_body_bytes, and no more text than one request's
        token budget would read (batching.max_request_tokens x MAX_CHARS_PER_TOKEN, the same bound a JSON answer
        meets in the engine). Past it the stream passes untouched, keeps no text, and is unchecked/too_large."""
        return min(self.tl.max_body_bytes, self.tl.batching.max_request_tokens * MAX_CHARS_PER_TOKEN)

    async def _check_sentence(self, sentence: str) -> DetectionResult:
        """One sentence of a streamed answer (detector and verifier: the surrogate's signals need the whole
        answer, so streams go without them), under the inference timeout. At most STREAM_CHECKS_IN_FLIGHT of
        one stream run at once (a fast stream's sentences wait here, not in the batchers every request shares),
        and once one failed (timeout, over budget, overloaded) the rest are not sent: the verdict says so."""
        if self._stream_slots is None:
            self._stream_slots = asyncio.Semaphore(STREAM_CHECKS_IN_FLIGHT)
        async with self._stream_slots:
            if self._stream_error is not None:
                raise self._stream_error
            ctx = self.ctx
            try:
                return await asyncio.wait_for(
                    self.rt.engine.detect(ctx.grounding, ctx.question, sentence, frozenset()),
                    self.rt.inference_timeout_s)
            except (InferenceError, asyncio.TimeoutError) as exc:
                self._stream_error = self._stream_error or exc
                raise

    def _stream_closing(self, outcome: StreamOutcome) -> bytes:
        """The events that close a stream: [warning per flagged choice] [finish, when stopped early] verdict
        [DONE when stopped early] (a stream that ends normally keeps its own [DONE] after them)."""
        ctx, d, a = self.ctx, self._decision, self.stream.assembler
        ctx.timings_ms["detect"] = ctx.timings_ms.get("detect", 0.0) + outcome.waited_ms
        if outcome.error is not None:
            self.verdict = Verdict.unchecked(d, self._unchecked_reason(outcome.error), latency_ms=ctx.spent_ms)
        elif outcome.too_large:
            self.verdict = Verdict.unchecked(d, UncheckedReason.TOO_LARGE, latency_ms=ctx.spent_ms)
        elif outcome.cut:
            self.verdict = Verdict.unchecked(d, UncheckedReason.INCOMPLETE, latency_ms=ctx.spent_ms)
        elif not outcome.results:
            self.verdict = Verdict.unchecked(d, UncheckedReason.NO_ANSWER, latency_ms=ctx.spent_ms)
        else:
            ctx.answers = tuple(a.text(i) for i in a.indices())
            ctx.choice_results = self._with_writer(outcome.results)
            self.verdict = self._with_upstream(worst_choice_verdict(d, ctx.choice_results, ctx.spent_ms))
        meta = {"id": a.id, "model": a.model, "created": a.created}
        out = b""
        if d.action != "none":
            plan = self._plan(self.verdict)
            if plan.warning and self.verdict.status is Status.CHECKED:
                for i in self._flagged(ctx.choice_results):
                    out += content_delta_chunk(i, plan.warning, **meta)
        if outcome.stopped:
            out += b"".join(finish_chunk(i, "content_filter", **meta) for i in a.indices())
        if d.action != "none" or outcome.stopped:
            out += verdict_chunk(verdict_payload(self.verdict), **meta)
        if outcome.stopped:
            out += DONE_EVENT
        return out

    # ---- detection --------------------------------------------------------------------------

    async def _judge(self, answers: Sequence[str | None]) -> tuple[Verdict, dict[int, DetectionResult]]:
        """Detect every choice that has text; the verdict follows the worst choice."""
        ctx, d = self.ctx, self._decision
        t0 = time.perf_counter()
        todo = [(i, a) for i, a in enumerate(answers) if a and a.strip()]
        if not todo:
            return Verdict.unchecked(d, UncheckedReason.NO_ANSWER, latency_ms=ctx.spent_ms), {}
        engine = self.rt.engine
        reason: UncheckedReason | None = None
        try:
            with stage("detect", mode=d.mode, choices=len(todo)):
                results = await asyncio.wait_for(
                    asyncio.gather(*(engine.detect(ctx.grounding, ctx.question, a, d.signals) for _, a in todo)),
                    self.rt.inference_timeout_s,
                )
        except Exception as exc:  # noqa: BLE001 - any engine failure: pass through, unchecked
            reason = self._unchecked_reason(exc)
        ctx.mark("detect", t0)
        if reason is not None:
            return Verdict.unchecked(d, reason, latency_ms=ctx.spent_ms), {}
        by_choice = self._with_writer({i: r for (i, _), r in zip(todo, results)})
        ctx.answers, ctx.choice_results = tuple(answers), by_choice
        return worst_choice_verdict(d, by_choice, ctx.spent_ms), by_choice

    def _with_writer(self, results: dict[int, DetectionResult]) -> dict[int, DetectionResult]:
        """Each choice's score stacked with the writer's own logprobs where upstream_fusion fits this writer."""
        return results if self.logprobs is None else self.logprobs.fused(self.rt.writer_fusion, results)

    def _with_upstream(self, verdict: Verdict) -> Verdict:
        """The upstream's own logprobs of the judged (worst) choice, on a finished check."""
        results = self.ctx.choice_results
        if verdict.status is not Status.CHECKED or self.logprobs is None or not results:
            return verdict
        signals = self.logprobs.signals(max(results, key=lambda i: results[i].score))
        return dataclasses.replace(verdict, upstream=signals) if signals is not None else verdict

    def _unchecked_reason(self, exc: BaseException) -> UncheckedReason:
        """Why a detection that raised leaves the answer unchecked."""
        if isinstance(exc, asyncio.TimeoutError):
            return UncheckedReason.TIMEOUT
        if isinstance(exc, Overloaded):
            return UncheckedReason.OVERLOADED
        if isinstance(exc, TooLarge):  # over batching.max_request_tokens: refused before any model work
            return UncheckedReason.TOO_LARGE
        if isinstance(exc, ModelUnavailable):
            return UncheckedReason.MODELS_UNAVAILABLE
        log.warning("request %s: detection failed: %r", self.ctx.request_id, exc)
        return UncheckedReason.ERROR

    def _flagged(self, results: dict[int, DetectionResult]) -> list[int]:
        threshold = self._decision.threshold
        return [i for i, r in results.items() if r.score >= threshold]

    # ---- shared -------------------------------------------------------------------------------

    @property
    def _decision(self) -> Decision:
        """Set by the request phase before any response phase runs (`_decide`)."""
        d = self.ctx.decision
        assert d is not None, "response phase before a decision"
        return d

    def _wants_mitigation(self) -> bool:
        return self.rt.mitigator is not None and self.ctx.decision is not None and self.ctx.decision.mode != "lightweight"

    def _plan(self, verdict: Verdict) -> ActionPlan:
        """The only place a verdict becomes wire actions (headers, warning, block)."""
        return plan_actions(verdict, self._decision, self.tl)

    def error_replies(self, phase: str) -> list[pb.ProcessingResponse]:
        """`error_reply` for every message still owed a reply: a stream that failed answers each chunk Envoy
        holds for it, unchanged, and lets the rest pass (its verdict event never comes: the status header
        said `streaming`, see docs/gateway.md)."""
        if phase == "response_body" and self.stream is not None and not self.stream.closed:
            log.exception("request %s: streamed body failed; passing the rest through", self.ctx.request_id)
            return [replies.continue_reply(phase)] * max(self.stream.abandon(), 1)
        return [self.error_reply(phase)]

    def error_reply(self, phase: str) -> pb.ProcessingResponse:
        """For a phase that raised (call it from the `except`): log the error, pass the body on
        unchanged, set verdict headers (unchecked/error) where they can still be set."""
        ctx = self.ctx
        if phase == "request_body" and self.rag_in_body:  # cannot tell whether the RAG field is gone: refuse
            log.exception("request %s: request_body failed; refusing (the RAG field may still be in it)", ctx.request_id)
            self.request_done = self.done = True
            return replies.refusal(500, "TruthLens could not process this request", self.tl.rag_context_field,
                                   "truthlens_error", (), error_type="truthlens_error")
        log.exception("request %s: %s failed; passing through unchecked", ctx.request_id, phase)
        if ctx.decision is None or phase not in ("response_headers", "response_body") or self.body_kind is BodyKind.SSE:
            return replies.continue_reply(phase)
        self.verdict = Verdict.unchecked(ctx.decision, UncheckedReason.ERROR, latency_ms=ctx.spent_ms)
        return replies.verdict_headers_reply(phase, self._plan(self.verdict).headers)
