#!/usr/bin/env python3
"""Container health check for the TruthLens sidecar: one grpc.health.v1 Check call.

Docker's HEALTHCHECK and Kubernetes exec probes run this where kubelet's `grpc:` probe cannot
reach (a sidecar on a Unix domain socket) or cannot speak (a sidecar with server.tls enabled).
Exit 0 only when the server answers SERVING; anything else (NOT_SERVING during shutdown,
unreachable, TLS failure, timeout) exits 1 with the reason on stderr, so `docker inspect` and
`kubectl describe pod` say why.

Address: argv[1], else $TRUTHLENS_HEALTH_ADDRESS, else 127.0.0.1:50051
(host:port or unix:/path, as in server.grpc_address).
TLS (when server.tls.enabled): $TRUTHLENS_HEALTH_TLS_CA (CA bundle that signed the server
certificate), $TRUTHLENS_HEALTH_TLS_CERT + $TRUTHLENS_HEALTH_TLS_KEY (client certificate, for
mTLS), $TRUTHLENS_HEALTH_TLS_SERVER_NAME (the name to verify, when it is not the host dialled).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
TIMEOUT_S = float(os.environ.get("TRUTHLENS_HEALTH_TIMEOUT_S", "2"))


def _read(env: str) -> bytes | None:
    path = os.environ.get(env)
    return Path(path).read_bytes() if path else None


def open_channel(address: str) -> grpc.Channel:
    """Plaintext unless $TRUTHLENS_HEALTH_TLS_CA is set."""
    ca = _read("TRUTHLENS_HEALTH_TLS_CA")
    if ca is None:
        return grpc.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=_read("TRUTHLENS_HEALTH_TLS_KEY"),
        certificate_chain=_read("TRUTHLENS_HEALTH_TLS_CERT"),
    )
    name = os.environ.get("TRUTHLENS_HEALTH_TLS_SERVER_NAME")
    options = [("grpc.ssl_target_name_override", name)] if name else []
    return grpc.secure_channel(address, creds, options=options)


def check(address: str, service: str = "", timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """Ask the health service; returns (serving, human-readable status)."""
    with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{address}: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else os.environ.get("TRUTHLENS_HEALTH_ADDRESS", DEFAULT_ADDRESS)
    try:
        serving, detail = check(address)
    except OSError as exc:  # a TLS file named in the environment is missing
        serving, detail = False, f"{address}: {exc}"
    print(detail, file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
