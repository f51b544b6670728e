"""The ext_proc stream loop: one gRPC stream = one HTTP request, dispatched phase by phase.

The RequestContext is a local of `Process`, so a stream that ends early (client gone, Envoy
reset, cancellation) leaves nothing behind. An exception inside a phase never breaks the
request: that phase answers "continue unchanged" and the verdict says unchecked/error.
"""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.gateway import stream_sse
from extproc.gateway.context import BodyKind, RequestContext, Route
from extproc.policy.actions import plan_actions
from extproc.policy.verdict import Status, UncheckedReason, Verdict
from extproc.protocol import envoy as ev
from extproc.gateway.stream_phases import NO_RESPONSE_BODY_MODE, Phases
from extproc.telemetry.logging import bind_request, unbind_request
from extproc.gateway.wiring import GatewayRuntime

log = logging.getLogger("truthlens.service")


class TruthLensService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, rt: GatewayRuntime) -> None:
        self.rt = rt
        self.phases = Phases(rt)
        self.active_streams = 0  # a gauge, not a registry: nothing per request is kept here

    async def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: object
    ) -> AsyncIterator[pb.ProcessingResponse]:
        ctx: RequestContext | None = None
        log_token = None
        self.active_streams += 1
        outcome = "aborted"
        messages = request_iterator.__aiter__()
        try:
            async for req in messages:
                phase = req.WhichOneof("request")
                if phase == "request_headers":
                    ctx, reply = self._start(req.request_headers)
                    if ctx is not None and ctx.route is Route.CHAT:  # every log line of this stream gets the id
                        log_token = bind_request(ctx)  # read from ctx only when a line is logged
                    yield reply
                    if ctx is not None and ctx.exchange_done:
                        break
                    continue
                if ctx is None:  # Envoy always starts with request headers; be defensive anyway
                    yield continue_reply(phase)
                    continue
                reply = self._reply_now(ctx, phase, req)
                if reply is None:  # this phase may wait (a model, a mitigation LLM call)
                    if (phase == "response_body" and ctx.body_kind is BodyKind.JSON
                            and self.phases.wants_mitigation(ctx)):
                        # standard/premium may re-ask an LLM: ask Envoy for more than message_timeout first
                        yield ev.timeout_extension_response(self.rt.mitigator.budget_s(ctx.decision.mode))
                    reply = await self._dispatch(ctx, phase, req)
                yield reply
                if ctx.exchange_done:
                    # Envoy sends nothing more on this stream: closing it now spares both sides
                    # the end-of-stream round (Envoy goes on without us after a clean close).
                    break
            outcome = "completed"
            if ctx is not None and ctx.exchange_done:
                await close_reader(messages)
        finally:
            self.active_streams -= 1
            if ctx is not None:
                ctx.cancel_pending()
            self._finish(ctx, outcome)
            if log_token is not None:
                try:
                    unbind_request(log_token)
                except ValueError:  # finalized from another context (generator closed late): nothing to undo there
                    pass

    def _start(self, http: pb.HttpHeaders) -> tuple[RequestContext | None, pb.ProcessingResponse]:
        try:
            return self.phases.request_headers(http)
        except Exception:  # noqa: BLE001
            log.exception("request_headers failed; passing the request through")
            return None, continue_reply("request_headers")

    def _reply_now(self, ctx: RequestContext, phase: str, req: pb.ProcessingRequest) -> pb.ProcessingResponse | None:
        """The phases that never wait, answered without a coroutine (most messages); None: use `_dispatch`."""
        try:
            if phase == "request_body":
                return self.phases.request_body(ctx, req.request_body)
            if phase == "response_headers" and ctx.sentinel_task is None:
                return self.phases.response_headers_now(ctx, req.response_headers)
            return None
        except Exception:  # noqa: BLE001 - the request must survive any bug of ours
            return self._error_reply(ctx, phase)

    async def _dispatch(self, ctx: RequestContext, phase: str, req: pb.ProcessingRequest) -> pb.ProcessingResponse:
        try:
            if phase == "response_headers":
                return await self.phases.response_headers(ctx, req.response_headers)
            if phase == "response_body":
                kind = ctx.body_kind
                if kind is BodyKind.SSE:
                    return await stream_sse.on_chunk(self.phases, ctx, req.response_body)
                if kind is BodyKind.JSON:
                    return await self.phases.response_json(ctx, req.response_body)
                if kind is BodyKind.BUFFERED_SSE:
                    return await stream_sse.on_buffered_stream(self.phases, ctx, req.response_body)
            return continue_reply(phase)
        except Exception:  # noqa: BLE001 - the request must survive any bug of ours
            return self._error_reply(ctx, phase)

    def _error_reply(self, ctx: RequestContext, phase: str) -> pb.ProcessingResponse:
        """For a phase that raised (call it from the `except`): log the error, pass the body on unchanged,
        set verdict headers (unchecked/error) where they can still be set."""
        log.exception("request %s: %s failed; passing through unchecked", ctx.request_id, phase)
        if ctx.decision is None or phase not in ("response_headers", "response_body") or ctx.body_kind is BodyKind.SSE:
            return continue_reply(phase)
        ctx.verdict = Verdict.unchecked(ctx.decision, UncheckedReason.ERROR, latency_ms=sum(ctx.timings_ms.values()))
        headers = plan_actions(ctx.verdict, ctx.decision, self.rt.config.truthlens).headers
        if phase == "response_headers":
            return ev.response_headers_response(headers, (), NO_RESPONSE_BODY_MODE)
        return ev.response_body_response(None, headers)

    def _finish(self, ctx: RequestContext | None, outcome: str) -> None:
        if ctx is None or ctx.route is not Route.CHAT:
            return
        v = ctx.verdict
        if self.rt.metrics is not None and v is not None:
            try:
                sentinel_by = ctx.sentinel.by if ctx.sentinel is not None else "model"
                record_verdict(self.rt.metrics, v, ctx.timings_ms, ctx.sentinel_ms, sentinel_by)
            except Exception:  # noqa: BLE001 - telemetry must never fail a request
                log.debug("metrics failed", exc_info=True)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request %s done: status=%s outcome=%s timings=%s total_ms=%.1f", ctx.request_id,
                      v.status if v is not None else "none", outcome, ctx.timings_ms,
                      (time.perf_counter() - ctx.started) * 1000)


_CONTINUE = {
    "request_headers": ev.request_headers_response(),
    "request_body": ev.request_body_response(None),
    "response_headers": ev.response_headers_response(),
    "response_body": ev.response_body_response(None),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    "response_trailers": pb.ProcessingResponse(response_trailers=pb.TrailersResponse()),
}


async def close_reader(messages: AsyncIterator[pb.ProcessingRequest]) -> None:
    """Close the stream's message reader we left early (grpc.aio's is an async generator).

    Left open, it is finalized by the garbage collector, and asyncio then schedules a task per
    stream just to close it: doing it here is a plain await.
    """
    aclose = getattr(messages, "aclose", None)
    if aclose is not None:
        await aclose()


def continue_reply(phase: str) -> pb.ProcessingResponse:
    """'Go on unchanged' for any phase (shared prebuilt messages: never mutate them)."""
    return _CONTINUE[phase]


# Stages worth a latency histogram: each can take milliseconds. The request phase itself
# (parsing, policy, prefilter) takes microseconds, so every sample would land in the first
# bucket while recording it costs about as much as the work it measures (an OTel histogram
# record is ~7 us). A request settled there (prefilter, no models, too large) is therefore
# counted by its status counter and not timed; `total` covers every request that waited on a
# model.
TIMED_STAGES = frozenset({"sentinel_wait", "detect", "mitigate"})


def record_verdict(m: Any, v: Verdict, timings_ms: dict[str, float], sentinel_ms: float = 0.0,
                   sentinel_by: str = "model") -> None:
    """One request's outcome into the metrics defined in extproc.telemetry.metrics."""
    if v.status is Status.CHECKED:
        m.record_detection(v.decision, v.mode, v.detected, v.score or 0.0, v.iterations)
    elif v.status is Status.SKIPPED:
        m.record_skipped()
    elif v.status is Status.UNVERIFIED:
        m.record_unverified()
    elif v.status is Status.UNCHECKED:
        m.record_unchecked(str(v.reason or UncheckedReason.ERROR))
    timed = False
    for stage, ms in timings_ms.items():
        if stage in TIMED_STAGES:
            m.record_latency(v.mode, stage, ms / 1000.0)
            timed = True
    if sentinel_ms:
        m.record_sentinel_decision(sentinel_by)
        if sentinel_by != "prefilter":
            m.record_latency(v.mode, "sentinel", sentinel_ms / 1000.0)
    if timed and v.status is not Status.DISABLED:
        m.record_latency(v.mode, "total", v.latency_ms / 1000.0)
