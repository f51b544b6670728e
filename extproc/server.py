"""grpc.aio server for the ext_proc service: health, TLS, message limits, shutdown order.

Shutdown order (uvicorn's, adapted to gRPC): health goes NOT_SERVING first so Envoy's health
checks and `grpc_health_probe` stop sending new streams, then `server.stop(grace)` refuses new
RPCs and lets in-flight streams finish for up to `grace` seconds, then cancels the rest.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.config import Config

log = logging.getLogger("truthlens.server")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """The server's settings, from the config's `server` section (`from_config`: its defaults are the config's)."""

    address: str  # host:port or unix:/path
    max_message_bytes: int
    shutdown_grace_s: float
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None  # set => mTLS: clients must present a certificate
    # the config's server.* values (from_config); 0 idle = never close an idle connection
    max_concurrent_streams: int = 0  # 0: gRPC's default (unbounded)
    max_connection_idle_s: float = 0.0
    keepalive_time_s: float = 0.0  # 0: gRPC's default
    keepalive_timeout_s: float = 0.0

    @classmethod
    def from_config(cls, cfg: Config, address: str | None = None, **overrides: Any) -> ServerOptions:
        """`address` (a command-line flag) replaces server.grpc_address; `overrides`: tests and tools."""
        s = cfg.server
        opts = cls(
            address=address or s.grpc_address,
            max_message_bytes=s.max_message_bytes,
            shutdown_grace_s=s.shutdown_grace_s,
            tls_cert_file=s.tls.cert_file if s.tls.enabled else None,
            tls_key_file=s.tls.key_file if s.tls.enabled else None,
            tls_client_ca_file=s.tls.client_ca_file if s.tls.enabled else None,
            max_concurrent_streams=s.max_concurrent_streams,
            max_connection_idle_s=s.max_connection_idle_s,
            keepalive_time_s=s.keepalive_time_s,
            keepalive_timeout_s=s.keepalive_timeout_s,
        )
        return replace(opts, **overrides) if overrides else opts


def grpc_options(opts: ServerOptions) -> list[tuple[str, int]]:
    """The grpc.aio server's channel arguments: message limits, stream cap, idle close, keepalive."""
    limit = opts.max_message_bytes
    out = [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.so_reuseport", 0),  # a second sidecar on the same port must fail, not share
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        # Envoy's cluster keepalive (production: every 30 s) must not count as ping abuse
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ]
    if opts.max_concurrent_streams:
        out.append(("grpc.max_concurrent_streams", opts.max_concurrent_streams))
    if opts.max_connection_idle_s:
        out.append(("grpc.max_connection_idle_ms", int(opts.max_connection_idle_s * 1000)))
    if opts.keepalive_time_s:
        out.append(("grpc.keepalive_time_ms", int(opts.keepalive_time_s * 1000)))
    if opts.keepalive_timeout_s:
        out.append(("grpc.keepalive_timeout_ms", int(opts.keepalive_timeout_s * 1000)))
    return out


class SidecarServer:
    """Owns the grpc.aio server and its health servicer; `start`, then `stop` once."""

    def __init__(self, servicer: ext_proc_grpc.ExternalProcessorServicer, opts: ServerOptions) -> None:
        self.opts = opts
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(options=grpc_options(opts))
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self._bind()
        self._stopped = False

    def _bind(self) -> int:
        o = self.opts
        if o.tls_cert_file and o.tls_key_file:
            key = Path(o.tls_key_file).read_bytes()
            cert = Path(o.tls_cert_file).read_bytes()
            ca = Path(o.tls_client_ca_file).read_bytes() if o.tls_client_ca_file else None
            creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
            port = self.server.add_secure_port(o.address, creds)
        else:
            port = self.server.add_insecure_port(o.address)
        if port == 0 and not o.address.startswith("unix:"):
            raise OSError(f"server.grpc_address: cannot bind {o.address}")
        return port

    @property
    def address(self) -> str:
        """The bound address (resolves port 0)."""
        if self.opts.address.startswith("unix:"):
            return self.opts.address
        host = self.opts.address.rpartition(":")[0]
        return f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ("", EXT_PROC_SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("sidecar listening on %s", self.address)

    async def stop(self, grace_s: float | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        grace = self.opts.shutdown_grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()  # NOT_SERVING before we refuse anything
        await self.server.stop(grace)
        log.info("sidecar stopped")

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def run_until_signal(server: SidecarServer, on_ready: asyncio.Event | None = None) -> None:
    """Start, serve until SIGTERM/SIGINT, then shut down in order."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    if on_ready is not None:
        on_ready.set()
    waiter = asyncio.ensure_future(server.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    log.info("shutting down (grace %.1fs)", server.opts.shutdown_grace_s)
    await server.stop()
    for task in (waiter, stopper):
        task.cancel()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
