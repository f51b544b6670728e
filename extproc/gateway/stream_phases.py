"""The work behind each ext_proc phase for one chat-completions request.

Request side: strip spoofed verdict headers, force `accept-encoding: identity`, choose the
decision, extract question + grounding, drop the RAG field, start the sentinel (it runs while the
request is with the LLM and is awaited when the response headers arrive). Everything that
fixes the verdict before the answer exists (disabled, skipped, unverified, unchecked) is put on
the response headers and the response body is then not even sent to us (mode override NONE).

Response side: JSON is judged whole (BUFFERED); SSE is switched to STREAMED, forwarded as it
comes, and the verdict event is inserted before `[DONE]` (extproc.gateway.stream_sse). Whatever cannot be judged passes
through byte-identical, marked unchecked with a reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.gateway.context import BodyKind, RequestContext, Route
from extproc.inference.api import DetectionResult, InferenceError, ModelUnavailable, Overloaded
from extproc.policy.actions import latency_header_value, plan_actions
from extproc.policy.decisions import Decision
from extproc.policy.verdict import Status, UncheckedReason, UnverifiedReason, Verdict
from extproc.protocol import envoy as ev
from extproc.protocol.encoding import BodyTooLarge, EncodingError, decode_body
from extproc.protocol.openai import ProtocolError, append_to_choices, parse_chat_request, parse_chat_response
from extproc.protocol.sse import ChatStreamRelay
from extproc.telemetry.tracing import stage
from extproc.gateway.wiring import GatewayRuntime

log = logging.getLogger("truthlens.phases")

CHAT_PATH_SUFFIX = "/chat/completions"
JSON_TYPES = ("application/json",)
SSE_TYPE = "text/event-stream"
FORCE_IDENTITY = (("accept-encoding", "identity"),)  # we must be able to read the answer
NO_RESPONSE_BODY_MODE = ev.processing_mode(response_body=ev.ProcessingMode.NONE)  # verdict known: body not needed
# The two replies almost every request gets, built once (shared: never mutate them).
_PASSTHROUGH_REPLY = ev.request_headers_response(mode_override=ev.SKIP_REST_MODE)
_CHAT_REQUEST_REPLY = ev.request_headers_response(FORCE_IDENTITY)
# Early-verdict replies shared across requests (never mutated): only for sub-millisecond verdicts,
# whose latency header takes one of ten values, and at most this many.
SHARED_REPLY_MAX_MS = 1.0
SHARED_REPLIES_MAX = 1024
STREAMING_STATUS = "streaming"  # x-truthlens-status while an SSE answer is still on its way


def decoded_encoding(ctx: RequestContext) -> list[str]:
    """A body we re-serialized from its decoded form no longer carries the upstream's encoding."""
    return ["content-encoding"] if ctx.content_encoding not in ("", "identity") else []


def is_chat_route(method: str, path: str) -> bool:
    return method == "POST" and path.split("?", 1)[0].rstrip("/").endswith(CHAT_PATH_SUFFIX)


class Phases:
    """Stateless apart from the shared runtime: all request state is in the RequestContext."""

    def __init__(self, rt: GatewayRuntime) -> None:
        self.rt = rt
        self.tl = rt.config.truthlens
        self._early_replies: dict[tuple[object, ...], tuple[Decision, pb.ProcessingResponse]] = {}

    # ---- request -----------------------------------------------------------------------

    def request_headers(self, http: pb.HttpHeaders) -> tuple[RequestContext, pb.ProcessingResponse]:
        ctx = RequestContext.from_http(http)
        spoofed = ev.truthlens_header_names(http)
        if not is_chat_route(ctx.method, ctx.path) or http.end_of_stream:
            # Not ours to judge: no body, no response work, no verdict headers.
            ctx.exchange_done = True
            if not spoofed:
                return ctx, _PASSTHROUGH_REPLY
            return ctx, ev.request_headers_response(remove_headers=spoofed, mode_override=ev.SKIP_REST_MODE)
        ctx.route = Route.CHAT
        if not self.rt.policy.uses_question:
            self._decide(ctx, None)
        return ctx, ev.request_headers_response(FORCE_IDENTITY, spoofed) if spoofed else _CHAT_REQUEST_REPLY

    def request_body(self, ctx: RequestContext, http: pb.HttpBody) -> pb.ProcessingResponse:
        """Synchronous: nothing here waits (the sentinel model, when needed, runs as a task)."""
        t0 = time.perf_counter()
        body = http.body
        if len(body) > self.tl.max_body_bytes:
            self._decide(ctx, None)
            ctx.fix_status(Status.UNCHECKED, UncheckedReason.TOO_LARGE)
            ctx.request_done = True
            return ev.request_body_response(None)
        try:
            chat = parse_chat_request(body, self.tl.rag_context_field or None)
        except ProtocolError as exc:
            log.info("request %s: not a judgeable chat request: %s", ctx.request_id, exc)
            self._decide(ctx, None)
            ctx.fix_status(Status.UNCHECKED, UncheckedReason.BAD_JSON)
            ctx.request_done = True
            return ev.request_body_response(None)
        ctx.question, ctx.system_prompt, ctx.grounding = chat.question, chat.system_prompt, chat.context
        ctx.stream_requested, ctx.model = chat.stream, chat.model
        decision = self._decide(ctx, chat.question)
        reply = ev.request_body_response(chat.upstream_body)
        if decision.mode != "lightweight":  # standard/premium re-ask with the original messages
            ctx.request_body = chat.upstream_body or body
        if not decision.enabled:
            ctx.fix_status(Status.DISABLED)
        else:
            if not chat.grounded:
                ctx.ungrounded_reason = UnverifiedReason.TOOLS_WITHOUT_RESULTS \
                    if chat.has_tools and not chat.has_tool_results else UnverifiedReason.NO_CONTEXT
            wants_sentinel = bool(ctx.question) and self.rt.engine.has("sentinel")
            quick = self.rt.engine.prefilter_prompt(self._sentinel_prompt(ctx)) if wants_sentinel else None
            if quick is not None:  # the lexical prefilter is sure: no task, no model call
                ctx.sentinel, ctx.sentinel_ms = quick, quick.latency_ms
                self._settle(ctx)
            elif wants_sentinel:
                # The verdict needs the sentinel only when the answer arrives: classify while the
                # request is with the LLM instead of holding the request for it.
                ctx.sentinel_task = asyncio.ensure_future(self._sentinel(ctx))
            else:
                self._settle(ctx)
        ctx.mark("request", t0)
        ctx.request_done = True
        return reply

    def _settle(self, ctx: RequestContext) -> None:
        """Everything the request teaches, in order: sentinel verdict, grounding, detector."""
        s = ctx.sentinel
        if s is not None and not s.needs_check:
            ctx.fix_status(Status.SKIPPED)
        if ctx.ungrounded_reason is not None:
            ctx.fix_status(Status.UNVERIFIED, ctx.ungrounded_reason)
        if not self.rt.engine.has("detector"):
            ctx.fix_status(Status.UNCHECKED, UncheckedReason.MODELS_UNAVAILABLE)

    async def _await_sentinel(self, ctx: RequestContext) -> None:
        task, ctx.sentinel_task = ctx.sentinel_task, None
        t0 = time.perf_counter()
        await task
        ctx.mark("sentinel_wait", t0)  # what the client waited for it: the time TruthLens added
        self._settle(ctx)

    def _decide(self, ctx: RequestContext, question: str | None):  # -> Decision
        policy = self.rt.policy
        if ctx.decision is None or policy.uses_question:
            # Without configured decisions the default applies: the headers are never decoded.
            ctx.decision = policy.decide(ctx.request_headers, question) if policy.has_decisions else policy.default
        return ctx.decision

    def _sentinel_prompt(self, ctx: RequestContext) -> str:
        prompt = ctx.question or ""
        if self.tl.sentinel_include_system_prompt and ctx.system_prompt:
            prompt = f"{ctx.system_prompt}\n\n{prompt}"
        return prompt

    async def _sentinel(self, ctx: RequestContext) -> None:
        """Classify the prompt; never raises (a failed classification means: check it)."""
        engine = self.rt.engine
        prompt = self._sentinel_prompt(ctx)
        t0 = time.perf_counter()
        try:
            with stage("sentinel", mode=ctx.decision.mode):
                # request_body already asked the prefilter, which was unsure: the model decides
                ctx.sentinel = await asyncio.wait_for(engine.classify_prompt(prompt, prefiltered=True),
                                                      self.rt.inference_timeout_s)
        except Overloaded:
            ctx.fix_status(Status.UNCHECKED, UncheckedReason.OVERLOADED)
        except (InferenceError, asyncio.TimeoutError) as exc:
            # Could not classify: fall back to checking (conservative), never to "skipped".
            log.warning("request %s: sentinel failed (%r); checking anyway", ctx.request_id, exc)
        except Exception:  # noqa: BLE001 - a background task must not die with an unread exception
            log.exception("request %s: sentinel raised; checking anyway", ctx.request_id)
        finally:
            ctx.sentinel_ms = (time.perf_counter() - t0) * 1000.0

    # ---- response headers --------------------------------------------------------------

    async def response_headers(self, ctx: RequestContext, http: pb.HttpHeaders) -> pb.ProcessingResponse:
        if ctx.sentinel_task is not None:
            await self._await_sentinel(ctx)
        return self.response_headers_now(ctx, http)

    def response_headers_now(self, ctx: RequestContext, http: pb.HttpHeaders) -> pb.ProcessingResponse:
        """`response_headers` once nothing is pending (no sentinel task): the common case, no await."""
        if not ctx.request_done:  # the request body phase never finished (a bug of ours): say so
            self._decide(ctx, None)
            ctx.fix_status(Status.UNCHECKED, UncheckedReason.ERROR)
        if ctx.early_status is not None:
            # The verdict was fixed before the answer: of these headers only forged verdict
            # headers matter (an upstream cannot forge a verdict either), so no values are decoded.
            spoofed = ev.truthlens_header_names(http)
        else:
            headers = ev.headers_dict(http)
            spoofed = ev.truthlens_header_names(headers)
            ctx.response_status = int(headers.get(":status", "0") or 0)
            ctx.content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            ctx.content_encoding = headers.get("content-encoding", "").strip().lower()
            if not 200 <= ctx.response_status < 300:
                ctx.fix_status(Status.UNCHECKED, UncheckedReason.UPSTREAM_ERROR)
            elif http.end_of_stream:
                ctx.fix_status(Status.UNCHECKED, UncheckedReason.NO_ANSWER)
            elif ctx.content_type in JSON_TYPES:
                ctx.body_kind = BodyKind.JSON
                return ev.response_headers_response((), spoofed)
            elif ctx.content_type == SSE_TYPE and ctx.content_encoding in ("", "identity"):
                if ctx.decision.action == "block":
                    # Blocking needs the whole answer before the client sees any of it.
                    ctx.body_kind = BodyKind.BUFFERED_SSE
                    return ev.response_headers_response((), spoofed)
                ctx.body_kind = BodyKind.SSE
                ctx.sse = ChatStreamRelay()
                early = () if ctx.decision.action == "none" else self._streaming_headers(ctx)
                # STREAMED: chunks reach us as they arrive; the builder also drops content-length
                return ev.response_headers_response(early, spoofed, ev.STREAMED_RESPONSE_MODE)
            else:
                ctx.fix_status(Status.UNCHECKED, UncheckedReason.UNSUPPORTED_CONTENT)
        ctx.verdict = self._early_verdict(ctx)
        ctx.exchange_done = True  # NO_RESPONSE_BODY_MODE: the body never comes (trailers are never asked for)
        if spoofed:
            plan = plan_actions(ctx.verdict, ctx.decision, self.tl)
            return ev.response_headers_response(plan.headers, spoofed, NO_RESPONSE_BODY_MODE)
        return self._early_reply(ctx.verdict, ctx.decision)

    def _early_reply(self, verdict: Verdict, decision: Decision) -> pb.ProcessingResponse:
        """The reply for a verdict fixed before the answer: most requests end here.

        A verdict settled in the request phase added well under a millisecond, so its reply
        (latency header included, one decimal) is one of a handful per (status, decision):
        those are built once and shared like the prebuilt "continue" replies. Slower ones
        (the sentinel model ran) are built per request. Only for `_early_verdict` results: the
        key leaves out score and spans, which such verdicts never have.
        """
        if verdict.latency_ms >= SHARED_REPLY_MAX_MS:
            return self._build_early_reply(verdict, decision)
        latency = latency_header_value(verdict.latency_ms)
        # Decisions are the policy's long-lived objects: their id is a cheap key (hashing the
        # frozen dataclass costs more than building the key), the stored object guards reuse.
        key = (verdict.status, verdict.reason, id(decision), latency)
        cached = self._early_replies.get(key)
        if cached is not None and cached[0] is decision:
            return cached[1]
        reply = self._build_early_reply(verdict, decision)
        if len(self._early_replies) < SHARED_REPLIES_MAX:
            self._early_replies[key] = (decision, reply)
        return reply

    def _build_early_reply(self, verdict: Verdict, decision: Decision) -> pb.ProcessingResponse:
        plan = plan_actions(verdict, decision, self.tl)
        return ev.response_headers_response(plan.headers, (), NO_RESPONSE_BODY_MODE)

    def _streaming_headers(self, ctx: RequestContext) -> tuple[tuple[str, str], ...]:
        out = [("x-truthlens-enabled", "true"), ("x-truthlens-status", STREAMING_STATUS),
               ("x-truthlens-mode", ctx.decision.mode)]
        if ctx.decision.name is not None:
            out.append(("x-truthlens-decision", ctx.decision.name))
        return tuple(out)

    def _early_verdict(self, ctx: RequestContext) -> Verdict:
        d, status, reason = ctx.decision, ctx.early_status, ctx.early_reason
        spent = sum(ctx.timings_ms.values())
        if status == Status.DISABLED:
            return Verdict.disabled(d)
        if status == Status.SKIPPED:
            return Verdict.skipped(d, latency_ms=spent)
        if status == Status.UNVERIFIED:
            return Verdict.unverified(d, reason or UnverifiedReason.NO_CONTEXT, latency_ms=spent)
        return Verdict.unchecked(d, reason or UncheckedReason.ERROR, latency_ms=spent)

    # ---- detection -----------------------------------------------------------------------

    async def judge(self, ctx: RequestContext, answers: Sequence[str | None]) -> tuple[Verdict, dict[int, DetectionResult]]:
        """Detect every choice that has text; the verdict follows the worst choice."""
        d = ctx.decision
        t0 = time.perf_counter()
        todo = [(i, a) for i, a in enumerate(answers) if a and a.strip()]
        if not todo:
            return Verdict.unchecked(d, UncheckedReason.NO_ANSWER, latency_ms=sum(ctx.timings_ms.values())), {}
        engine = self.rt.engine
        reason: UncheckedReason | None = None
        try:
            with stage("detect", mode=d.mode, choices=len(todo)):
                results = await asyncio.wait_for(
                    asyncio.gather(*(engine.detect(ctx.grounding, ctx.question, a, d.signals) for _, a in todo)),
                    self.rt.inference_timeout_s,
                )
        except asyncio.TimeoutError:
            reason = UncheckedReason.TIMEOUT
        except Overloaded:
            reason = UncheckedReason.OVERLOADED
        except ModelUnavailable:
            reason = UncheckedReason.MODELS_UNAVAILABLE
        except Exception as exc:  # noqa: BLE001 - any engine failure: pass through, unchecked
            log.warning("request %s: detection failed: %r", ctx.request_id, exc)
            reason = UncheckedReason.ERROR
        ctx.mark("detect", t0)
        spent = sum(ctx.timings_ms.values())
        if reason is not None:
            return Verdict.unchecked(d, reason, latency_ms=spent), {}
        by_choice = {i: r for (i, _), r in zip(todo, results)}
        ctx.answers, ctx.choice_results = tuple(answers), by_choice
        worst = max(by_choice.values(), key=lambda r: r.score)
        ctx.detection = worst
        return Verdict.checked(d, worst, iterations=1, latency_ms=spent), by_choice

    # ---- response body: buffered JSON ------------------------------------------------------

    async def response_json(self, ctx: RequestContext, http: pb.HttpBody) -> pb.ProcessingResponse:
        verdict, text = await self._judge_json(ctx, http.body)
        ctx.verdict = verdict
        new_body: bytes | None = None
        if text is not None and verdict.actionable and self.wants_mitigation(ctx):
            ctx.verdict, new_body = await self.rt.mitigator.mitigate(ctx, text, verdict)
        plan = plan_actions(ctx.verdict, ctx.decision, self.tl)
        if plan.block is not None:
            return ev.immediate_response(plan.block.status, plan.block.headers, plan.block.body)
        if plan.warning and text is not None:
            flagged = [i for i, r in ctx.choice_results.items() if r.score >= ctx.decision.threshold]
            new_body = append_to_choices(new_body or text, {i: plan.warning for i in flagged} or plan.warning)
        if new_body is None:
            return ev.response_body_response(None, plan.headers)
        return ev.response_body_response(new_body, plan.headers, decoded_encoding(ctx))

    def wants_mitigation(self, ctx: RequestContext) -> bool:
        return self.rt.mitigator is not None and ctx.decision is not None and ctx.decision.mode != "lightweight"

    async def _judge_json(self, ctx: RequestContext, body: bytes) -> tuple[Verdict, bytes | None]:
        """Verdict and the decoded body (None when it could not be judged)."""
        d, spent = ctx.decision, sum(ctx.timings_ms.values())
        if len(body) > self.tl.max_body_bytes:
            return Verdict.unchecked(d, UncheckedReason.TOO_LARGE, latency_ms=spent), None
        try:
            text = decode_body(body, ctx.content_encoding, self.tl.max_body_bytes)
        except BodyTooLarge:
            return Verdict.unchecked(d, UncheckedReason.TOO_LARGE, latency_ms=spent), None
        except EncodingError:
            return Verdict.unchecked(d, UncheckedReason.UNSUPPORTED_CONTENT, latency_ms=spent), None
        try:
            answers = parse_chat_response(text).answers
        except ProtocolError:
            return Verdict.unchecked(d, UncheckedReason.BAD_JSON, latency_ms=spent), None
        verdict, _ = await self.judge(ctx, answers)
        return verdict, text
