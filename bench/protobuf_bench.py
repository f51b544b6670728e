"""Per-message cost of the ext_proc protobuf layer: xds-protos vs envoy-data-plane (betterproto2).

One "message" is what the gateway does for each ext_proc message it receives:
parse the serialized ProcessingRequest, read its headers (or body), build the reply and
serialize it. Both libraries parse the same bytes (Envoy's wire format) and their replies are
checked to be wire-equivalent before timing.

Scenarios:
  request_headers  15 request headers (raw_value), reply sets accept-encoding: identity and
                   removes a spoofed x-truthlens-* header
  response_body    4 KiB buffered JSON body, reply replaces the body and sets content-length
                   plus two x-truthlens-* headers

Variants:
  xds-protos/builders   the hot path as shipped: extproc.protocol.envoy helpers
  xds-protos/inline     the same work written directly against the generated classes
  envoy-data-plane      the same work with betterproto2 (pydantic dataclasses)

envoy-data-plane 2.x installs under the top-level package `envoy_data_plane`, so it does not
collide with xds-protos's `envoy` package and both run in the project venv.

Usage:
  nice -n 15 .venv/bin/python -m bench.protobuf_bench --iterations 20000 --out bench/results/protobuf.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from bench.common import command, cpu_name, write_results
from extproc.protocol import envoy as E

HEADERS = [
    (":authority", "llm.internal.example.com"),
    (":path", "/v1/chat/completions"),
    (":method", "POST"),
    (":scheme", "https"),
    ("content-type", "application/json"),
    ("content-length", "4096"),
    ("authorization", "Bearer sk-test-0123456789abcdefghijklmnopqrstuvwxyz"),
    ("user-agent", "OpenAI/Python 1.54.0"),
    ("accept", "application/json"),
    ("accept-encoding", "gzip, deflate, br"),
    ("x-request-id", "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"),
    ("x-forwarded-for", "10.0.0.12"),
    ("x-forwarded-proto", "https"),
    ("x-team", "platform"),
    ("x-truthlens-status", "clean"),  # spoofed by the client: must be stripped
]
assert len(HEADERS) == 15
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _request_headers_bytes() -> bytes:
    req = ep.ProcessingRequest()
    for key, value in HEADERS:
        req.request_headers.headers.headers.add(key=key, raw_value=value.encode())
    return req.SerializeToString()


def _response_body_bytes() -> tuple[bytes, bytes]:
    content = "The capital of France is Paris. " * 110
    body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]}).encode()[:4096]
    req = ep.ProcessingRequest()
    req.response_body.body = body
    req.response_body.end_of_stream = True
    return req.SerializeToString(), body + b"\n[TruthLens warning]"


REQ_HEADERS = _request_headers_bytes()
REQ_BODY, NEW_BODY = _response_body_bytes()
VERDICT = [("x-truthlens-status", "detected"), ("x-truthlens-score", "0.83")]


# ---- xds-protos, through the shipped builders --------------------------------------------
def xds_builders_headers(data: bytes) -> bytes:
    req = ep.ProcessingRequest.FromString(data)
    headers = E.headers_dict(req.request_headers)
    assert headers[":path"]
    spoofed = E.truthlens_header_names(headers)
    return E.request_headers_response({"accept-encoding": "identity"}, spoofed).SerializeToString()


def xds_builders_body(data: bytes) -> bytes:
    req = ep.ProcessingRequest.FromString(data)
    assert req.response_body.end_of_stream and req.response_body.body
    return E.response_body_response(NEW_BODY, VERDICT).SerializeToString()


# ---- xds-protos, inline --------------------------------------------------------------------
def xds_inline_headers(data: bytes) -> bytes:
    req = ep.ProcessingRequest.FromString(data)
    headers = {h.key: h.raw_value.decode() for h in req.request_headers.headers.headers}
    assert headers[":path"]
    resp = ep.ProcessingResponse()
    mutation = resp.request_headers.response.header_mutation
    opt = mutation.set_headers.add()
    opt.header.key = "accept-encoding"
    opt.header.raw_value = b"identity"
    opt.append_action = OVERWRITE
    mutation.remove_headers.extend(k for k in headers if k.startswith("x-truthlens-"))
    return resp.SerializeToString()


def xds_inline_body(data: bytes) -> bytes:
    req = ep.ProcessingRequest.FromString(data)
    assert req.response_body.end_of_stream and req.response_body.body
    resp = ep.ProcessingResponse()
    common = resp.response_body.response
    for key, value in [*VERDICT, ("content-length", str(len(NEW_BODY)))]:
        opt = common.header_mutation.set_headers.add()
        opt.header.key = key
        opt.header.raw_value = value.encode()
        opt.append_action = OVERWRITE
    common.body_mutation.body = NEW_BODY
    return resp.SerializeToString()


# ---- envoy-data-plane (betterproto2) ------------------------------------------------------
def _edp() -> dict[str, Callable[[bytes], bytes]]:
    from envoy_data_plane.envoy.config.core import v3 as core
    from envoy_data_plane.envoy.service.ext_proc import v3 as b

    overwrite = core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD

    def option(key: str, value: bytes) -> core.HeaderValueOption:
        return core.HeaderValueOption(header=core.HeaderValue(key=key, raw_value=value), append_action=overwrite)

    def headers(data: bytes) -> bytes:
        req = b.ProcessingRequest.parse(data)
        hdrs = {h.key: h.raw_value.decode() for h in req.request_headers.headers.headers}
        assert hdrs[":path"]
        mutation = b.HeaderMutation(set_headers=[option("accept-encoding", b"identity")],
                                    remove_headers=[k for k in hdrs if k.startswith("x-truthlens-")])
        resp = b.ProcessingResponse(request_headers=b.HeadersResponse(response=b.CommonResponse(header_mutation=mutation)))
        return bytes(resp)

    def body(data: bytes) -> bytes:
        req = b.ProcessingRequest.parse(data)
        assert req.response_body.end_of_stream and req.response_body.body
        sets = [option(k, v.encode()) for k, v in [*VERDICT, ("content-length", str(len(NEW_BODY)))]]
        common = b.CommonResponse(header_mutation=b.HeaderMutation(set_headers=sets),
                                  body_mutation=b.BodyMutation(body=NEW_BODY))
        return bytes(b.ProcessingResponse(response_body=b.BodyResponse(response=common)))

    return {"headers": headers, "body": body}


def _same_wire(a: bytes, b: bytes) -> bool:
    """Equal as messages (field order on the wire may differ between libraries)."""
    return ep.ProcessingResponse.FromString(a) == ep.ProcessingResponse.FromString(b)


def measure(fn: Callable[[bytes], bytes], data: bytes, iterations: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        fn(data)
    gc.collect()
    clock = time.perf_counter_ns
    samples = [0] * iterations
    cpu0 = time.thread_time_ns()
    for i in range(iterations):
        t0 = clock()
        fn(data)
        samples[i] = clock() - t0
    cpu_us = (time.thread_time_ns() - cpu0) / 1000 / iterations  # immune to time spent descheduled
    samples.sort()
    us = [s / 1000 for s in samples]
    return {
        "mean_us": statistics.fmean(us),
        "p50_us": us[len(us) // 2],
        "p99_us": us[min(len(us) - 1, int(len(us) * 0.99))],
        "cpu_mean_us": cpu_us,
        "iterations": iterations,
    }


IMPORTS = {
    "xds-protos": "envoy.service.ext_proc.v3.external_processor_pb2_grpc",
    "envoy-data-plane": "envoy_data_plane.envoy.service.ext_proc.v3",
}


def import_seconds(module: str, repeat: int = 3) -> float:
    """Fresh-interpreter import time of the ext_proc service module (best of `repeat`)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
            for _ in range(repeat)]
    return min(runs)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _backend() -> str:
    try:
        from google.protobuf.internal import api_implementation

        return api_implementation.Type()
    except ImportError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    args = parser.parse_args(argv)

    edp = _edp()
    variants = {
        "request_headers": [("xds-protos/builders", xds_builders_headers), ("xds-protos/inline", xds_inline_headers),
                            ("envoy-data-plane", edp["headers"])],
        "response_body": [("xds-protos/builders", xds_builders_body), ("xds-protos/inline", xds_inline_body),
                          ("envoy-data-plane", edp["body"])],
    }
    inputs = {"request_headers": REQ_HEADERS, "response_body": REQ_BODY}
    for scenario, fns in variants.items():  # same work, same wire result, before timing anything
        reference = fns[0][1](inputs[scenario])
        for name, fn in fns[1:]:
            assert _same_wire(reference, fn(inputs[scenario])), f"{scenario}/{name} differs on the wire"

    load_before = os.getloadavg()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for scenario, fns in variants.items():
        results[scenario] = {}
        for name, fn in fns:
            results[scenario][name] = stats = measure(fn, inputs[scenario], args.iterations, args.warmup)
            print(f"{scenario:16s} {name:22s} mean {stats['mean_us']:8.1f} µs  p50 {stats['p50_us']:8.1f} µs"
                  f"  p99 {stats['p99_us']:8.1f} µs  cpu {stats['cpu_mean_us']:8.1f} µs  (n={args.iterations})", flush=True)
    load_after = os.getloadavg()
    imports = {name: import_seconds(module) for name, module in IMPORTS.items()}
    for name, secs in imports.items():
        print(f"import {name:18s} {secs * 1000:8.0f} ms")

    if args.out is not None:
        write_results(args.out, _report(results, imports, args, load_before, load_after))
        print(f"wrote {args.out}")
    return 0


def _report(results, imports, args, load_before, load_after) -> str:
    lines = [
        "# ext_proc protobuf layer: xds-protos vs envoy-data-plane",
        "",
        "Per-message cost of parse (serialized ProcessingRequest) + read + build reply + serialize.",
        "Produced by `python -m bench.protobuf_bench` (its docstring describes the scenarios).",
        "",
        "## Command",
        "",
        "```",
        command("bench.protobuf_bench"),
        "```",
        "",
        "## Machine",
        "",
        f"- CPU: {cpu_name()}, {os.cpu_count()} cores visible, no GPU; shared with other jobs "
        f"(load average {load_before[0]:.1f} before, {load_after[0]:.1f} after)",
        f"- Python {platform.python_version()} ({platform.system()} {platform.machine()})",
        f"- xds-protos {_version('xds-protos')}, protobuf {_version('protobuf')} (backend: {_backend()}), "
        f"envoy-data-plane {_version('envoy-data-plane')}, betterproto2 {_version('betterproto2')}, "
        f"pydantic {_version('pydantic')}",
        "- Both libraries in the same venv: envoy-data-plane 2.x lives under `envoy_data_plane`, no clash with "
        "xds-protos's `envoy` package.",
        "",
        "## Results (µs per message)",
        "",
        "Wall-clock per message (mean, p50, p99) and CPU time per message (thread CPU time over the whole",
        "run divided by iterations; it excludes time spent descheduled, so it is the figure least distorted",
        "by other jobs on this shared machine). The CPU figure includes the two clock reads per iteration.",
        "",
        "| scenario | library | mean | p50 | p99 | CPU mean | iterations |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for scenario, per in results.items():
        for name, s in per.items():
            lines.append(f"| {scenario} | {name} | {s['mean_us']:.1f} | {s['p50_us']:.1f} | {s['p99_us']:.1f} "
                         f"| {s['cpu_mean_us']:.1f} | {s['iterations']} |")
    lines.append("")
    for scenario, per in results.items():
        base_p50 = per["xds-protos/builders"]["p50_us"]
        cpu = per["xds-protos/builders"]["cpu_mean_us"]
        lines.append(f"- {scenario}: envoy-data-plane costs {per['envoy-data-plane']['p50_us'] / base_p50:.0f}x "
                     f"(p50) and {per['envoy-data-plane']['cpu_mean_us'] / cpu:.0f}x (CPU mean) what "
                     f"xds-protos/builders costs.")
    lines += ["", "## Import time (fresh interpreter, best of 3)", "", "| library | module | ms |", "|---|---|---:|"]
    for name, secs in imports.items():
        lines.append(f"| {name} | `{IMPORTS[name]}` | {secs * 1000:.0f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
