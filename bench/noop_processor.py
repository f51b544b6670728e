"""A do-nothing ext_proc processor: the benchmark's baseline for "Envoy + any ext_proc".

It answers every phase with an empty response of the matching kind (continue, no mutation),
over the same grpc.aio server, message limits and xds-protos stubs as TruthLens, so the
difference between it and TruthLens is TruthLens's own work.
"""

from __future__ import annotations

from typing import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

_EMPTY = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()).SerializeToString(),
    "response_headers": pb.ProcessingResponse(response_headers=pb.HeadersResponse()).SerializeToString(),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()).SerializeToString(),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()).SerializeToString(),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()).SerializeToString(),
    "response_trailers": pb.ProcessingResponse(response_trailers=pb.TrailersResponse()).SerializeToString(),
}


class NoopProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self) -> None:
        self._replies = {k: pb.ProcessingResponse.FromString(v) for k, v in _EMPTY.items()}

    async def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: object
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for req in request_iterator:
            yield self._replies[req.WhichOneof("request")]


def main() -> None:
    import argparse
    import asyncio

    from extproc.config import default_config
    from extproc.server import ServerOptions, SidecarServer, run_until_signal

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", default="127.0.0.1:50052")
    args = p.parse_args()

    async def serve() -> None:
        ready = asyncio.Event()
        server = SidecarServer(NoopProcessor(), ServerOptions.from_config(default_config(), address=args.address))
        task = asyncio.ensure_future(run_until_signal(server, ready))
        await ready.wait()
        print(f"noop ext_proc ready on {server.address}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
