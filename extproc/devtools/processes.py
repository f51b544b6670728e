"""Child processes for dev tools and benchmarks: stop one politely, wait until it serves.

Used by `truthlens dev`, bench/gateway_bench.py and the end-to-end test harness, which also start a
real Envoy with `EnvoyProcess` (a config rendered by extproc.devtools.envoy_config).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from extproc.devtools.envoy_config import EnvoyOptions, resolve_envoy_binary, write_config


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EnvoyProcess:
    sidecar_address: str
    upstream_url: str
    with_ext_proc: bool = True
    failure_mode_allow: bool = True
    message_timeout_s: float = 10.0
    concurrency: int = 1
    listen_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _dir: tempfile.TemporaryDirectory[str] | None = None

    def start(self, timeout: float = 60.0) -> EnvoyProcess:
        self._dir = tempfile.TemporaryDirectory(prefix="truthlens-envoy-")
        opts = EnvoyOptions(listen_port=self.listen_port, admin_port=self.admin_port,
                            sidecar_address=self.sidecar_address, upstream_url=self.upstream_url,
                            failure_mode_allow=self.failure_mode_allow, message_timeout_s=self.message_timeout_s,
                            with_ext_proc=self.with_ext_proc)
        cfg = write_config(opts, Path(self._dir.name) / "envoy.yaml")
        log = open(Path(self._dir.name) / "envoy.log", "wb")  # noqa: SIM115 - lives as long as Envoy
        self.proc = subprocess.Popen(
            [resolve_envoy_binary(), "-c", str(cfg), "--log-level", "warning", "--concurrency", str(self.concurrency),
             "--base-id", str(self.admin_port), "--disable-hot-restart"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        if not wait_http_ok(f"http://127.0.0.1:{self.admin_port}/ready", timeout, self.proc):
            raise RuntimeError(f"Envoy did not become ready: {self.log_tail()}")
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def log_tail(self, n: int = 4000) -> str:
        if self._dir is None:
            return ""
        p = Path(self._dir.name) / "envoy.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def stats(self, prefix: str = "") -> dict[str, int]:
        text = httpx.get(f"http://127.0.0.1:{self.admin_port}/stats?filter={prefix}").text
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
        if self._dir is not None:
            self._dir.cleanup()
