"""One request's sentinel call: does the prompt need fact-checking at all?

The lexical prefilter answers inline when it is sure (no task, no model call); otherwise the
sentinel model classifies the prompt as a task while the request is with the LLM, and the exchange
awaits it only when the response headers arrive. A failed classification means "check it": never
"skipped".
"""

from __future__ import annotations

import asyncio
import logging
import time

from extproc.inference.api import Engine, InferenceError, Overloaded, SentinelResult
from extproc.telemetry.tracing import stage

log = logging.getLogger("truthlens.exchange")


class SentinelCall:
    __slots__ = ("result", "task", "ms", "overloaded")

    def __init__(self) -> None:
        self.result: SentinelResult | None = None
        self.task: asyncio.Task[None] | None = None  # the model's classification while the LLM answers
        self.ms = 0.0  # compute time (overlapped with the upstream, so not "added" latency)
        self.overloaded = False  # the engine refused it (admission limit): the answer will be unchecked

    def start(self, engine: Engine, prompt: str, timeout_s: float, mode: str, request_id: str) -> bool:
        """True when the prompt is settled now (the prefilter is sure); False: the model runs as a task."""
        quick = engine.prefilter_prompt(prompt)
        if quick is not None:
            self.result, self.ms = quick, quick.latency_ms
            return True
        self.task = asyncio.ensure_future(self.classify(engine, prompt, timeout_s, mode, request_id))
        return False

    async def classify(self, engine: Engine, prompt: str, timeout_s: float, mode: str, request_id: str) -> None:
        """The model's verdict; never raises (a background task must not die with an unread exception)."""
        t0 = time.perf_counter()
        try:
            with stage("sentinel", mode=mode):
                # start() already asked the prefilter, which was unsure: the model decides
                self.result = await asyncio.wait_for(engine.classify_prompt(prompt, prefiltered=True), timeout_s)
        except Overloaded:
            self.overloaded = True
        except (InferenceError, asyncio.TimeoutError) as exc:
            log.warning("request %s: sentinel failed (%r); checking anyway", request_id, exc)
        except Exception:  # noqa: BLE001
            log.exception("request %s: sentinel raised; checking anyway", request_id)
        finally:
            self.ms = (time.perf_counter() - t0) * 1000.0

    @property
    def pending(self) -> bool:
        return self.task is not None

    async def wait(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            await task

    def cancel(self) -> None:
        """The stream ended early: stop work nobody will read."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.task = None
