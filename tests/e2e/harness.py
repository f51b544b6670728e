"""Start the real pieces on loopback for end-to-end tests.

Order: scripted upstream, then the sidecar (gRPC health SERVING), then Envoy (admin /ready).
The sidecar runs in-process on its own thread and event loop so a test can give it an engine
double and read its stream gauge; `SidecarProcess` runs the real `truthlens serve` instead, and `process_stack`
starts it with Envoy in front of an upstream and stops all of them whatever happens.
Envoy itself (`EnvoyProcess`) comes from extproc/devtools/processes.py, shared with the gateway benchmark.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from extproc.config import default_config
from extproc.devtools.processes import EnvoyProcess, free_port, terminate, wait_grpc_serving
from extproc.inference.api import DetectionResult, ModelInfo, Overloaded, SentinelResult, Span
from extproc.server import ServerOptions, SidecarServer

REPO = Path(__file__).resolve().parents[2]


class SidecarThread:
    """A grpc.aio server with any ExternalProcessor servicer, on a private loop in a thread."""

    def __init__(self, servicer: Any, address: str = "127.0.0.1:0", grace_s: float = 2.0) -> None:
        self.servicer = servicer
        self.loop = asyncio.new_event_loop()
        self._opts = ServerOptions.from_config(default_config(), address=address, shutdown_grace_s=grace_s)
        self.server: SidecarServer | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="sidecar", daemon=True)

    def start(self) -> SidecarThread:
        self._thread.start()

        async def boot() -> SidecarServer:
            server = SidecarServer(self.servicer, self._opts)
            await server.start()
            return server

        self.server = asyncio.run_coroutine_threadsafe(boot(), self.loop).result(30)
        return self

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.server is not None:
            self.call(self.server.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class SidecarProcess:
    """The real `truthlens serve` command in a subprocess."""

    def __init__(self, config: str | None = None, extra_env: dict[str, str] | None = None) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "extproc.commands.serve", "--grpc-address", self.address, "--no-metrics"]
        if config:
            cmd += ["--config", config]
        env = {**os.environ, **(extra_env or {})}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        if not wait_grpc_serving(self.address, timeout, self.proc):
            out = self.proc.stdout.read().decode() if self.proc.poll() is not None and self.proc.stdout else ""
            raise RuntimeError(f"truthlens serve did not become SERVING: {out[-2000:]}")

    def stop(self) -> int:
        terminate(self.proc)
        return self.proc.returncode


@contextmanager
def process_stack(config: str | Path, upstream: Any, *, ready_timeout: float = 120.0, also_stop: Sequence[Any] = (),
                  **envoy: Any) -> Iterator[tuple[SidecarProcess, EnvoyProcess]]:
    """`truthlens serve` with `config` and a real Envoy in front of `upstream` (keyword arguments: EnvoyProcess
    options). On exit, whatever happened, Envoy stops first, then the sidecar, `also_stop` and the upstream."""
    sidecar = SidecarProcess(str(config))
    proxy: EnvoyProcess | None = None
    try:
        sidecar.wait_ready(timeout=ready_timeout)
        proxy = EnvoyProcess(sidecar.address, upstream.url, **envoy).start()
        yield sidecar, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        sidecar.stop()
        for part in also_stop:
            part.stop()
        upstream.stop()


# ---- an Engine test double ---------------------------------------------------------------

FLAG_WORD = "Oslo"  # the demo upstream's injected claim mentions it; the test engine flags it


class ScriptedTestEngine:
    """TEST ENGINE (not a model): deterministic sentinel/detector for gateway tests.

    Sentinel: a prompt containing "poem" or "joke" is non-factual. Detector: the sentence of the
    answer that contains FLAG_WORD is a span with score 0.9 unless a context passage mentions
    FLAG_WORD too (then it is supported); otherwise the score is 0.05.
    Questions containing TRIGGER_TIMEOUT / TRIGGER_OVERLOAD / TRIGGER_ERROR make it misbehave.
    """

    def __init__(self, roles: Sequence[str] = ("sentinel", "detector"), delay_s: float = 0.0) -> None:
        self.roles = set(roles)
        self.delay_s = delay_s
        self.calls: list[tuple[str, str]] = []
        self.sentinel_gate: asyncio.Event | None = None  # set by a test: classify waits for it

    def models(self) -> Sequence[ModelInfo]:
        return tuple(ModelInfo(r, f"test-{r}", "<memory>", "TestEngine") for r in sorted(self.roles))

    def has(self, role: str) -> bool:
        return role in self.roles

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        """Sure about prompts that say PREFILTER_SKIP (non-factual, no model call); else defers."""
        if "PREFILTER_SKIP" in prompt:
            self.calls.append(("prefilter", prompt))
            return SentinelResult(needs_check=False, confidence=0.001, latency_ms=0.01, by="prefilter")
        return None

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        self.calls.append(("sentinel", prompt))
        if self.sentinel_gate is not None:
            await self.sentinel_gate.wait()
        low = prompt.lower()
        non_factual = "poem" in low or "joke" in low
        return SentinelResult(needs_check=not non_factual, confidence=0.1 if non_factual else 0.9)

    async def detect(self, context: Sequence[str], question: str | None, answer: str,
                     signals: frozenset[str] | None = None) -> DetectionResult:
        self.calls.append(("detect", answer))
        q = question or ""
        if "TRIGGER_TIMEOUT" in q:
            await asyncio.sleep(30)
        if "TRIGGER_OVERLOAD" in q:
            raise Overloaded("queue full")
        if "TRIGGER_ERROR" in q:
            raise RuntimeError("engine exploded")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        at = answer.find(FLAG_WORD)
        if at < 0 or any(FLAG_WORD in passage for passage in context):
            return DetectionResult(score=0.05, spans=())
        start = answer.rfind(".", 0, at) + 1
        while start < at and answer[start] == " ":
            start += 1
        end = answer.find(".", at)
        end = len(answer) if end < 0 else end + 1
        span = Span(start=start, end=end, text=answer[start:end], score=0.9, tokens=8)
        return DetectionResult(score=0.9, spans=(span,))

    async def close(self) -> None:
        return None
