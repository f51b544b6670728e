"""Child processes for dev tools and benchmarks: stop one politely, wait until it serves.

Used by `truthlens dev`, bench/gateway_bench.py and the end-to-end test harness.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time


def terminate(p: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_grpc_serving(address: str, timeout: float, proc: subprocess.Popen[bytes] | None = None,
                      stop: threading.Event | None = None) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if (proc is not None and proc.poll() is not None) or (stop is not None and stop.is_set()):
                return False
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


def wait_http_ok(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None,
                 stop: threading.Event | None = None) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (proc is not None and proc.poll() is not None) or (stop is not None and stop.is_set()):
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False
