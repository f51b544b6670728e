"""`RemoteEngine`: the `Engine` protocol over the detection API (proto/truthlens/v1) of a detector pool.

With `truthlens.inference.remote` set the sidecar loads no model: sentinel, detector and explainer
run in `truthlens serve --detector-api` processes that scale apart from the Envoy pods (GPU nodes,
for instance). Failures map to the exceptions a local engine raises, so the gateway answers
`unchecked` exactly as it does when a local model fails (fail-open):

  no endpoint reachable (UNAVAILABLE)       RemoteUnavailable (a ModelUnavailable): models_unavailable
  every endpoint tried was overloaded       Overloaded: overloaded
  the call's deadline passed                RemoteTimeout (an InferenceError and a TimeoutError): timeout
  the pool lacks the model (FAILED_PRECONDITION, UNIMPLEMENTED)   ModelUnavailable
  over the pool's max_request_tokens (OUT_OF_RANGE)                 TooLarge: too_large
  anything else                             InferenceError: error

Endpoints: a list of `host:port` (each call starts at the next one, round robin; a failed attempt
moves to the next, endpoints that just failed are tried last), or one `dns:///host:port` name whose
addresses gRPC balances itself (`load_balancing: round_robin`, e.g. a headless Service), where a retry
picks another address. One deadline covers a call and its retries. Only UNAVAILABLE and
RESOURCE_EXHAUSTED (and ABORTED) are retried: every RPC here is a read, safe to send twice.

This module imports neither Envoy nor gateway code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import grpc

from extproc.api import convert
from extproc.api.v1 import detection_pb2 as pb
from extproc.api.v1 import detection_pb2_grpc as pb_grpc
from extproc.inference.api import (
    Claim,
    DetectionResult,
    InferenceError,
    ModelInfo,
    ModelUnavailable,
    Overloaded,
    SentinelResult,
    TooLarge,
)

log = logging.getLogger(__name__)

# Until the pool has said which models it serves, assume the standard set: a call for a model it
# lacks fails with ModelUnavailable, as a local engine's would.
DEFAULT_ROLES = frozenset({"sentinel", "detector", "explainer"})
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})
MISSING_MODEL = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED})


class RemoteUnavailable(ModelUnavailable):
    """No endpoint of the detector pool answered."""


class RemoteTimeout(InferenceError, TimeoutError):
    """The remote call's deadline passed (the gateway reports it as a timeout)."""


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """Filled from `truthlens.inference.*` (the config schema holds the defaults); the rest are tuning."""

    endpoints: tuple[str, ...]
    deadline_s: float  # one call, retries included
    retries: int
    load_balancing: str  # round_robin | pick_first
    max_message_bytes: int
    down_s: float = 2.0  # an endpoint that was unavailable is tried after the others for this long
    info_retry_s: float = 2.0  # GetInfo again this soon while the pool has not answered it
    info_refresh_s: float = 30.0  # and this often afterwards (a redeployed pool may serve other models)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("truthlens.inference.remote: expected at least one endpoint")

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> "RemoteSettings":
        """From the typed config (`extproc.config.schema.Config`); only reads attributes."""
        inf = cfg.truthlens.inference
        values = dict(endpoints=tuple(inf.remote), deadline_s=inf.deadline_ms / 1000.0, retries=inf.retries,
                      load_balancing=inf.load_balancing, max_message_bytes=cfg.server.max_message_bytes)
        return cls(**{**values, **overrides})


class RemoteEngine:
    """Implements api.Engine by calling `truthlens.v1.Detection` on a pool of detector processes."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        n = len(settings.endpoints)
        self._stubs: list[pb_grpc.DetectionStub | None] = [None] * n  # channels open on first use, on the loop
        self._channels: list[grpc.aio.Channel | None] = [None] * n
        self._down_until = [0.0] * n
        self._next = 0
        self._roles: frozenset[str] | None = None  # None: the pool has not answered GetInfo yet
        self._models: tuple[ModelInfo, ...] = ()
        self._signals: frozenset[str] = frozenset()
        self.pool_version: str | None = None  # the pool's truthlens version, once it answered GetInfo
        self._info_task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> "RemoteEngine":
        return cls(RemoteSettings.from_config(cfg))

    # ---- what the pool serves --------------------------------------------------------------

    def models(self) -> Sequence[ModelInfo]:
        return self._models

    def has(self, role: str) -> bool:
        return role in (DEFAULT_ROLES if self._roles is None else self._roles)

    @property
    def signals(self) -> frozenset[str]:
        return self._signals

    async def refresh(self) -> bool:
        """Ask the pool which models and signals it serves; False when no endpoint answered."""
        try:
            info: pb.GetInfoResponse = await self._call("GetInfo", pb.GetInfoRequest())
        except InferenceError as exc:
            log.debug("detector pool: GetInfo failed: %r", exc)
            return False
        where = ",".join(self.settings.endpoints)
        self._models = convert.models_from_proto(info.models, f"remote:{where}")
        self._roles = frozenset(m.role for m in info.models)
        self._signals = frozenset(info.signals)
        self.pool_version = info.version
        return True

    async def start(self) -> None:
        """Learn the pool's models now if it answers, and keep them current in the background."""
        if await self.refresh():
            log.info("detector pool %s: models %s (truthlens %s)", ",".join(self.settings.endpoints),
                     ",".join(f"{m.role}={m.name}" for m in self._models) or "none", self.pool_version)
        else:
            log.warning("detector pool %s: not reachable yet; responses are unchecked until it answers",
                        ",".join(self.settings.endpoints))
        if self._info_task is None:
            self._info_task = asyncio.ensure_future(self._keep_info())

    async def _keep_info(self) -> None:
        ok = self._roles is not None
        while True:
            await asyncio.sleep(self.settings.info_refresh_s if ok else self.settings.info_retry_s)
            ok = await self.refresh() or ok

    # ---- the Engine calls -----------------------------------------------------------------

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        return None  # the pool runs the lexical prefilter (ClassifyPrompt without skip_prefilter)

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        # `prefiltered` means our prefilter_prompt was asked; it never decides, so the pool's prefilter still may
        reply = await self._call("ClassifyPrompt", pb.ClassifyPromptRequest(prompt=prompt))
        return convert.sentinel_from_proto(reply)

    async def detect(self, context: Sequence[str], question: str | None, answer: str,
                     signals: frozenset[str] | None = None) -> DetectionResult:
        reply = await self._call("Detect", convert.detect_request(context, question, answer, signals))
        return convert.detection_from_proto(reply)

    async def explain(self, context: Sequence[str], answer: str,
                      ranges: Sequence[tuple[int, int]] | None = None) -> tuple[Claim, ...]:
        req = pb.ExplainRequest(context=list(context), answer=answer,
                                ranges=[pb.TextRange(start=a, end=b) for a, b in ranges or ()])
        return convert.claims_from_proto(await self._call("Explain", req))

    async def close(self) -> None:
        if self._info_task is not None:
            self._info_task.cancel()
            self._info_task = None
        channels, self._channels = self._channels, [None] * len(self._channels)
        self._stubs = [None] * len(self._stubs)
        for ch in channels:
            if ch is not None:
                await ch.close()

    # ---- transport ------------------------------------------------------------------------

    def _stub(self, i: int) -> pb_grpc.DetectionStub:
        stub = self._stubs[i]
        if stub is None:
            s = self.settings
            options = [
                ("grpc.max_send_message_length", s.max_message_bytes),
                ("grpc.max_receive_message_length", s.max_message_bytes),
                ("grpc.service_config", json.dumps({"loadBalancingConfig": [{s.load_balancing: {}}]})),
                ("grpc.enable_retries", 0),  # retries are ours: on another endpoint, inside one deadline
                # a restarted pod is found again within seconds, not the default two minutes of backoff
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.min_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 2000),
                ("grpc.keepalive_time_ms", 20000),
                ("grpc.keepalive_timeout_ms", 5000),
                ("grpc.dns_min_time_between_resolutions_ms", 5000),  # pool pods come and go
            ]
            self._channels[i] = grpc.aio.insecure_channel(s.endpoints[i], options=options)
            stub = self._stubs[i] = pb_grpc.DetectionStub(self._channels[i])
        return stub

    def _order(self) -> list[int]:
        """Endpoints for one call: round robin over the list, the recently unavailable ones last."""
        n = len(self.settings.endpoints)
        start, self._next = self._next, (self._next + 1) % n
        rotated = [(start + k) % n for k in range(n)]
        now = time.monotonic()
        return sorted(rotated, key=lambda i: self._down_until[i] > now)

    async def _call(self, method: str, request: Any) -> Any:
        s = self.settings
        deadline = time.monotonic() + s.deadline_s
        order = self._order()
        last: grpc.aio.AioRpcError | None = None
        for attempt in range(1 + s.retries):
            i = order[attempt % len(order)]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return await getattr(self._stub(i), method)(request, timeout=remaining)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise RemoteTimeout(f"{method} on {s.endpoints[i]}: deadline of {s.deadline_s:g}s passed") from exc
                if code not in RETRYABLE:
                    raise _error(method, s.endpoints[i], exc) from exc
                if code == grpc.StatusCode.UNAVAILABLE:
                    self._down_until[i] = time.monotonic() + s.down_s
                log.debug("%s on %s: %s (attempt %d)", method, s.endpoints[i], code.name, attempt + 1)
                last = exc
        if last is None:
            raise RemoteTimeout(f"{method}: deadline of {s.deadline_s:g}s passed")
        where = ",".join(s.endpoints)
        if last.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise Overloaded(f"{method}: detector pool {where} overloaded: {last.details()}")
        raise RemoteUnavailable(f"{method}: detector pool {where} unavailable: {last.details()}")


def _error(method: str, endpoint: str, exc: grpc.aio.AioRpcError) -> InferenceError:
    message = f"{method} on {endpoint}: {exc.code().name}: {exc.details()}"
    if exc.code() in MISSING_MODEL:
        return ModelUnavailable(message)
    if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
        return TooLarge(message)
    return InferenceError(message)
