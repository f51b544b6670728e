"""`truthlens serve --detector-api`: the detection API (proto/truthlens/v1) over a local engine.

Any application can call it without Envoy, and sidecars configured with
`truthlens.inference.remote` send their detection here (a detector pool that scales apart from
the Envoy pods). Next to it: the standard grpc.health.v1 service, SERVING for "" and
"truthlens.v1.Detection" once the models are loaded, NOT_SERVING first on shutdown.

Engine errors become gRPC status codes the remote engine maps back to the same exceptions:
ModelUnavailable -> FAILED_PRECONDITION, Overloaded -> RESOURCE_EXHAUSTED, TooLarge (over
batching.max_request_tokens) -> OUT_OF_RANGE, a malformed request
(ValueError) -> INVALID_ARGUMENT, any other failure -> INTERNAL.
"""

from __future__ import annotations

import logging
import time
from importlib import metadata
from typing import Any, Awaitable, Callable, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.api import convert
from extproc.api.v1 import detection_pb2 as pb
from extproc.api.v1 import detection_pb2_grpc as pb_grpc
from extproc.inference.api import Engine, InferenceError, ModelUnavailable, Overloaded, TooLarge
from extproc.server import ServerOptions, SidecarServer

log = logging.getLogger("truthlens.detector_api")

SERVICE = pb.DESCRIPTOR.services_by_name["Detection"].full_name  # truthlens.v1.Detection
T = TypeVar("T")


def _version() -> str:
    try:
        return metadata.version("truthlens")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class DetectionServicer(pb_grpc.DetectionServicer):
    """Each RPC awaits the engine on the server's event loop; the engine batches concurrent calls."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.version = _version()

    async def _run(self, context: grpc.aio.ServicerContext, what: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except ModelUnavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Overloaded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc) or "overloaded")
        except TooLarge as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc) or "too large")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except InferenceError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, f"{what}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the caller gets a status, the log gets the traceback
            log.exception("%s failed", what)
            await context.abort(grpc.StatusCode.INTERNAL, f"{what}: {type(exc).__name__}")
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    async def Detect(self, request: pb.DetectRequest, context: grpc.aio.ServicerContext) -> pb.DetectResponse:
        ctx, question, answer, signals = convert.detect_args(request)
        result = await self._run(context, "detect", lambda: self.engine.detect(ctx, question, answer, signals))
        return convert.detection_to_proto(result)

    async def ClassifyPrompt(self, request: pb.ClassifyPromptRequest,
                             context: grpc.aio.ServicerContext) -> pb.ClassifyPromptResponse:
        async def classify() -> Any:
            if not self.engine.has("sentinel"):
                raise ModelUnavailable("sentinel model not loaded")
            if not request.skip_prefilter:
                quick = self.engine.prefilter_prompt(request.prompt)
                if quick is not None:
                    return quick
            return await self.engine.classify_prompt(request.prompt, prefiltered=True)

        return convert.sentinel_to_proto(await self._run(context, "classify_prompt", classify))

    async def Explain(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.ExplainResponse:
        explain = getattr(self.engine, "explain", None)
        if explain is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this engine cannot explain")
        ranges = [(r.start, r.end) for r in request.ranges]
        t0 = time.perf_counter()
        claims = await self._run(context, "explain", lambda: explain(list(request.context), request.answer, ranges))
        return convert.claims_to_proto(claims, (time.perf_counter() - t0) * 1000.0)

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.GetInfoResponse:
        signals = sorted(getattr(self.engine, "signals", ()) or ())
        return pb.GetInfoResponse(version=self.version, models=convert.models_to_proto(self.engine.models()),
                                  signals=signals)


class DetectorApiServer(SidecarServer):
    """The grpc.aio server for the detection API: same listener options, TLS, health and shutdown
    order as the ext_proc sidecar's (`extproc.server.SidecarServer`), another service."""

    def __init__(self, engine: Engine, opts: ServerOptions) -> None:  # noqa: D107 - replaces the ext_proc wiring
        self.opts = opts
        self.health = health.aio.HealthServicer()
        limit = opts.max_message_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
                ("grpc.so_reuseport", 0),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        self.servicer = DetectionServicer(engine)
        pb_grpc.add_DetectionServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self._bind()
        self._stopped = False

    async def start(self) -> None:
        await self.server.start()
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("detection API listening on %s", self.address)
