"""k8s/docker/healthcheck.py (Docker HEALTHCHECK, exec probes for the UDS sidecar) against a
real grpc.health.v1 server, over TCP and over a Unix domain socket."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.support import ROOT, run

SCRIPT = ROOT / "k8s" / "docker" / "healthcheck.py"


@pytest.fixture()
def health_server(tmp_path: Path) -> Iterator[tuple[health.HealthServicer, list[str]]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    sock = tmp_path / "extproc.sock"
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        yield servicer, [f"127.0.0.1:{port}", f"unix:{sock}"]
    finally:
        server.stop(0)


def _probe(address: str) -> tuple[int, str]:
    proc = run([sys.executable, str(SCRIPT), address], env={"TRUTHLENS_HEALTH_TIMEOUT_S": "2", "PATH": ""})
    return proc.returncode, proc.stdout + proc.stderr


def test_serving_exits_zero(health_server: tuple[health.HealthServicer, list[str]]) -> None:
    servicer, addresses = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    for address in addresses:
        assert _probe(address) == (0, f"{address}: SERVING\n")


def test_not_serving_exits_one(health_server: tuple[health.HealthServicer, list[str]]) -> None:
    servicer, addresses = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # what graceful shutdown reports
    for address in addresses:
        rc, out = _probe(address)
        assert rc == 1 and "NOT_SERVING" in out


def test_unreachable_exits_one_with_the_reason(tmp_path: Path) -> None:
    rc, out = _probe(f"unix:{tmp_path / 'nobody.sock'}")
    assert rc == 1 and "UNAVAILABLE" in out
