"""grpc.aio server: health, graceful shutdown order, message limits, TLS and mTLS."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.config import default_config, parse_config
from extproc.server import EXT_PROC_SERVICE, ServerOptions, SidecarServer


def options(**kw) -> ServerOptions:
    """The default config's server settings on an ephemeral port, plus `kw`."""
    return ServerOptions.from_config(default_config(), address="127.0.0.1:0", **kw)


class SlowProcessor(pb_grpc.ExternalProcessorServicer):
    """Answers each message after `delay` seconds (an in-flight stream during shutdown)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.started = asyncio.Event()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: object):  # noqa: N802
        async for _ in request_iterator:
            self.started.set()
            await asyncio.sleep(self.delay)
            yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())


def headers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders())


async def check(address: str, service: str = "", **kw: object) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5, **kw)
        return r.status


async def test_health_serving_for_overall_and_ext_proc() -> None:
    server = SidecarServer(SlowProcessor(0), options())
    await server.start()
    try:
        assert await check(server.address) == health_pb2.HealthCheckResponse.SERVING
        assert await check(server.address, EXT_PROC_SERVICE) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


async def test_graceful_shutdown_not_serving_first_and_in_flight_stream_finishes() -> None:
    proc = SlowProcessor(0.6)
    server = SidecarServer(proc, options(shutdown_grace_s=5))
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.ExternalProcessorStub(ch)
        call = stub.Process()
        await call.write(headers_msg())
        await proc.started.wait()
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.1)
        status = await server.health.Check(health_pb2.HealthCheckRequest(service=""), None)
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        reply = await call.read()  # the in-flight stream still gets its answer
        assert reply.HasField("request_headers")
        await call.done_writing()
        await stopping
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Process([headers_msg()]).read()


async def test_grace_period_bounds_a_hung_stream() -> None:
    proc = SlowProcessor(60)
    server = SidecarServer(proc, options(shutdown_grace_s=0.3))
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as ch:
        call = pb_grpc.ExternalProcessorStub(ch).Process()
        await call.write(headers_msg())
        await proc.started.wait()
        await asyncio.wait_for(server.stop(), 10)  # returns after the grace period, not after 60 s
        with pytest.raises(grpc.aio.AioRpcError):
            await call.read()


async def test_max_message_size_is_enforced() -> None:
    server = SidecarServer(SlowProcessor(0), options(max_message_bytes=4096))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            big = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * 10_000))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.ExternalProcessorStub(ch).Process([big]).read()
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(0)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=test-ca", cwd=d)
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)
    return d


async def _tls_check(address: str, pki: Path, with_client_cert: bool) -> int:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes() if with_client_cert else None,
        certificate_chain=(pki / "client.pem").read_bytes() if with_client_cert else None,
    )
    async with grpc.aio.secure_channel(address, creds) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return r.status


async def test_tls_and_mtls(pki: Path) -> None:
    tls = SidecarServer(SlowProcessor(0), options(
        tls_cert_file=str(pki / "server.pem"), tls_key_file=str(pki / "server.key")))
    mtls = SidecarServer(SlowProcessor(0), options(
        tls_cert_file=str(pki / "server.pem"), tls_key_file=str(pki / "server.key"),
        tls_client_ca_file=str(pki / "ca.pem")))
    await tls.start()
    await mtls.start()
    try:
        assert await _tls_check(tls.address, pki, with_client_cert=False) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):  # plaintext client against a TLS server
            await check(tls.address)
        assert await _tls_check(mtls.address, pki, with_client_cert=True) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):  # mTLS: no client certificate, no service
            await _tls_check(mtls.address, pki, with_client_cert=False)
    finally:
        await tls.stop(0)
        await mtls.stop(0)


def test_server_options_come_from_config(tmp_path: Path) -> None:
    files = {name: str(tmp_path / name) for name in ("c.pem", "k.pem", "ca.pem")}
    for f in files.values():
        Path(f).write_text("x")
    cfg = parse_config({"server": {"grpc_address": "unix:/tmp/tl.sock", "max_message_bytes": 2048,
                                   "shutdown_grace_s": 3,
                                   "tls": {"enabled": True, "cert_file": files["c.pem"], "key_file": files["k.pem"],
                                           "client_ca_file": files["ca.pem"]}}})
    o = ServerOptions.from_config(cfg)
    assert (o.address, o.max_message_bytes, o.shutdown_grace_s) == ("unix:/tmp/tl.sock", 2048, 3)
    assert (o.tls_cert_file, o.tls_key_file, o.tls_client_ca_file) == (files["c.pem"], files["k.pem"], files["ca.pem"])
    plain = ServerOptions.from_config(parse_config({}), address="127.0.0.1:0")
    assert (plain.address, plain.tls_cert_file) == ("127.0.0.1:0", None)


def test_stream_cap_idle_close_and_keepalive_come_from_the_config() -> None:
    """#19: direct gRPC held ~22 MB per 1,000 idle streams with no stream cap or idle timeout."""
    from extproc.server import grpc_options

    opts = dict(grpc_options(ServerOptions.from_config(parse_config({"server": {
        "max_concurrent_streams": 7, "max_connection_idle_s": 1.5, "keepalive_time_s": 30, "keepalive_timeout_s": 5}}))))
    assert opts["grpc.max_concurrent_streams"] == 7
    assert opts["grpc.max_connection_idle_ms"] == 1500
    assert (opts["grpc.keepalive_time_ms"], opts["grpc.keepalive_timeout_ms"]) == (30_000, 5_000)
    defaults = dict(grpc_options(options()))
    assert defaults["grpc.max_concurrent_streams"] == 1024 and defaults["grpc.max_connection_idle_ms"] == 300_000
    assert "grpc.max_connection_idle_ms" not in dict(grpc_options(options(max_connection_idle_s=0.0)))


async def test_streams_beyond_the_cap_wait_for_a_free_one() -> None:
    server = SidecarServer(SlowProcessor(0), options(max_concurrent_streams=1))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))  # holds the only stream
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            watch.cancel()
            await asyncio.sleep(0.1)
            assert (await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)).status == \
                health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)
