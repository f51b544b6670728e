"""TruthLens's own per-request Python, without gRPC, Envoy or sockets.

Drives `TruthLensService.Process` in-process with the three ext_proc messages of a non-factual
chat request (request headers, request body, response headers: the response body never comes,
see docs/gateway.md) and times whole streams, next to the do-nothing processor of
bench/gateway_bench.py answering the four messages it gets. Messages are parsed from bytes and
replies serialized, as gRPC would. This is the hot-loop cost (warm caches, one core to itself);
on a saturated machine shared with Envoy the same code costs several times more, which is what
bench/gateway_bench.py measures.

    .venv/bin/python -m bench.hotpath_bench --requests 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from typing import Any, AsyncIterator

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench.common import RESULTS, command, machine, write_results

PROMPT = "Write a short poem about the sea."


def _headers(pairs: list[tuple[str, str]]) -> pb.HttpHeaders:
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])
    return pb.HttpHeaders(headers=hm)


def stream_messages(prompt: str) -> list[bytes]:
    """What Envoy sends for one chat request, with the headers Envoy itself adds."""
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": prompt}]}).encode()
    answer = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
    msgs = [
        pb.ProcessingRequest(request_headers=_headers([
            (":authority", "127.0.0.1:8080"), (":path", "/v1/chat/completions"), (":method", "POST"),
            (":scheme", "http"), ("content-type", "application/json"), ("content-length", str(len(body))),
            ("x-forwarded-proto", "http"), ("x-request-id", "6b1c2a4e-0d4f-4c8e-9d65-2f7c8f6a1b3d"),
            ("x-envoy-expected-rq-timeout-ms", "300000")])),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=_headers([
            (":status", "200"), ("content-type", "application/json"), ("content-length", str(len(answer))),
            ("x-envoy-upstream-service-time", "0")])),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=answer, end_of_stream=True)),
    ]
    return [m.SerializeToString() for m in msgs]


async def time_streams(servicer: Any, wire: list[bytes], requests: int, repeats: int) -> list[float]:
    """Microseconds per stream, one figure per repeat; replies are consumed up to the last one."""

    async def one() -> None:
        async def incoming() -> AsyncIterator[pb.ProcessingRequest]:
            for raw in wire:
                yield pb.ProcessingRequest.FromString(raw)

        async for reply in servicer.Process(incoming(), None):
            reply.SerializeToString()

    for _ in range(min(1000, requests)):
        await one()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(requests):
            await one()
        out.append((time.perf_counter() - t0) / requests * 1e6)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.noop_processor import NoopProcessor
    from extproc.config import default_config
    from extproc.gateway.service import TruthLensService
    from extproc.telemetry.metrics import Metrics
    from extproc.gateway.wiring import GatewayRuntime, build_engine

    cfg = default_config()
    rt = GatewayRuntime(cfg, build_engine(cfg), metrics=Metrics("bench"))
    wire = stream_messages(args.prompt)
    truthlens = asyncio.run(time_streams(TruthLensService(rt), wire[:3], args.requests, args.repeats))
    noop = asyncio.run(time_streams(NoopProcessor(), wire, args.requests, args.repeats))
    quick = rt.engine.prefilter_prompt(args.prompt)
    return {"truthlens_us": truthlens, "noop_us": noop, "prompt": args.prompt,
            "decided_by": quick.by if quick is not None else "model",
            "command": command("bench.hotpath_bench"),
            "machine": f"{machine(kernel=False)}, Python {platform.python_version()}"}


def report(r: dict[str, Any]) -> str:
    tl, noop = statistics.median(r["truthlens_us"]), statistics.median(r["noop_us"])
    return "\n".join([
        "# Per-request Python of the sidecar (no gRPC, no Envoy)",
        "",
        f"Command: `{r['command']}` (from the repository root)",
        "",
        f"Machine: {r['machine']}.",
        "",
        f"One non-factual chat request (`{r['prompt']}`, decided by the {r['decided_by']}) driven through "
        "`TruthLensService.Process` in-process: request headers, request body, response headers (the "
        "verdict is fixed before the answer, so the response body is never sent). Metrics on, as "
        "deployed. The do-nothing processor answers the four messages it gets. Median of the repeats; "
        "warm caches and an idle core; on the saturated 2 cores of bench/results/gateway.md the same code costs several "
        "times this.",
        "",
        "| processor | µs per request (median) | repeats |",
        "|---|---:|---|",
        f"| TruthLens | {tl:.1f} | {', '.join(f'{x:.1f}' for x in r['truthlens_us'])} |",
        f"| do-nothing | {noop:.1f} | {', '.join(f'{x:.1f}' for x in r['noop_us'])} |",
        "",
        *(["## Notes", "", *[f"* {n}" for n in r["notes"]], ""] if r.get("notes") else []),
    ])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000, help="streams per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--out", default=str(RESULTS / "hotpath.md"))
    p.add_argument("--note", action="append", default=[], help="a line for the report's Notes section")
    args = p.parse_args()
    r = run(args)
    r["notes"] = args.note
    write_results(args.out, report(r), r)
    print(report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
