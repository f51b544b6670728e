"""The ext_proc stream loop: one gRPC stream = one HTTP request, dispatched phase by phase.

The loop only dispatches: each stream gets its own ChatExchange (extproc.gateway.exchange), a
local of `Process`, whose phase methods build the replies; the loop writes them. A stream that
ends early (client gone, Envoy reset, cancellation) leaves nothing behind. An exception inside a
phase never breaks the request: the exchange's `error_reply` answers "continue unchanged" and the
verdict says unchecked/error.
"""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.gateway.exchange import ChatExchange, Route
from extproc.gateway.replies import EarlyReplies, continue_reply
from extproc.policy.verdict import Status, UncheckedReason, Verdict
from extproc.protocol import envoy as ev
from extproc.telemetry.logging import bind_request, unbind_request
from extproc.gateway.wiring import GatewayRuntime

log = logging.getLogger("truthlens.service")


class TruthLensService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, rt: GatewayRuntime) -> None:
        self.rt = rt
        self.early_replies = EarlyReplies()  # shared by every stream of this process
        self.active_streams = 0  # a gauge, not a registry: nothing per request is kept here

    async def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: object
    ) -> AsyncIterator[pb.ProcessingResponse]:
        ex: ChatExchange | None = None
        log_token = None
        self.active_streams += 1
        outcome = "aborted"
        messages = request_iterator.__aiter__()
        try:
            async for req in messages:
                phase = req.WhichOneof("request")
                if phase == "request_headers":
                    ex, reply = self._start(req.request_headers)
                    if ex is not None and ex.route is Route.CHAT:  # every log line of this stream gets the id
                        log_token = bind_request(ex.ctx)  # read from the context only when a line is logged
                elif ex is None:  # Envoy always starts with request headers; be defensive anyway
                    reply = continue_reply(phase)
                else:
                    try:
                        if phase == "request_body":
                            out = [ex.request_body(req.request_body)]
                        elif phase == "response_headers":
                            if ex.sentinel_pending:
                                await ex.await_sentinel()
                            out = [ex.response_headers(req.response_headers)]
                        elif phase == "response_body":
                            budget = ex.mitigation_budget_s()
                            if budget:  # standard/premium may re-ask an LLM: ask Envoy for more time first
                                yield ev.timeout_extension_response(budget)
                            # a stream's chunk may wait (Envoy holds it) or release several held ones
                            out = await ex.response_body(req.response_body)
                        else:
                            out = [continue_reply(phase)]
                    except Exception:  # noqa: BLE001 - the request must survive any bug of ours
                        out = ex.error_replies(phase)
                    for reply in out:
                        yield reply
                    if ex.done:
                        break
                    continue
                yield reply
                if ex is not None and ex.done:
                    # Envoy sends nothing more on this stream: closing it now spares both sides
                    # the end-of-stream round (Envoy goes on without us after a clean close).
                    break
            outcome = "completed"
            if ex is not None and ex.done:
                await close_reader(messages)
        finally:
            self.active_streams -= 1
            if ex is not None:
                ex.cancel_pending()
            self._finish(ex, outcome)
            if log_token is not None:
                try:
                    unbind_request(log_token)
                except ValueError:  # finalized from another context (generator closed late): nothing to undo there
                    pass

    def _start(self, http: pb.HttpHeaders) -> tuple[ChatExchange | None, pb.ProcessingResponse]:
        try:
            ex = ChatExchange(self.rt, self.early_replies, http)
            return ex, ex.request_headers(http)
        except Exception:  # noqa: BLE001
            log.exception("request_headers failed; passing the request through")
            return None, continue_reply("request_headers")

    def _finish(self, ex: ChatExchange | None, outcome: str) -> None:
        if ex is None or ex.route is not Route.CHAT:
            return
        v, ctx = ex.verdict, ex.ctx
        if self.rt.metrics is not None and v is not None:
            try:
                s = ex.sentinel
                record_verdict(self.rt.metrics, v, ctx.timings_ms, s.ms, s.result.by if s.result is not None else "model")
            except Exception:  # noqa: BLE001 - telemetry must never fail a request
                log.debug("metrics failed", exc_info=True)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request %s done: status=%s outcome=%s timings=%s total_ms=%.1f", ctx.request_id,
                      v.status if v is not None else "none", outcome, ctx.timings_ms,
                      (time.perf_counter() - ctx.started) * 1000)


async def close_reader(messages: AsyncIterator[pb.ProcessingRequest]) -> None:
    """Close the stream's message reader we left early (grpc.aio's is an async generator).

    Left open, it is finalized by the garbage collector, and asyncio then schedules a task per
    stream just to close it: doing it here is a plain await.
    """
    aclose = getattr(messages, "aclose", None)
    if aclose is not None:
        await aclose()


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
