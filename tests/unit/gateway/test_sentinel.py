"""SentinelCall: the prefilter settles inline, the model runs as a task, failures mean "check it"."""

from __future__ import annotations

import asyncio

from extproc.gateway.sentinel import SentinelCall
from extproc.inference.api import InferenceError, Overloaded, SentinelResult


class Engine:
    def __init__(self, quick: SentinelResult | None = None, fail: BaseException | None = None) -> None:
        self.quick, self.fail, self.calls = quick, fail, 0
        self.gate = asyncio.Event()

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        return self.quick

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        self.calls += 1
        assert prefiltered  # the prefilter was asked already
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return SentinelResult(needs_check=True, confidence=0.9)


def test_a_sure_prefilter_settles_without_a_task() -> None:
    call, quick = SentinelCall(), SentinelResult(needs_check=False, confidence=0.01, latency_ms=0.02, by="prefilter")
    assert call.start(Engine(quick), "a poem", 1.0, "lightweight", "r") is True
    assert call.result is quick and not call.pending and call.ms == 0.02


async def test_the_model_classifies_while_the_request_is_away() -> None:
    engine, call = Engine(), SentinelCall()
    assert call.start(engine, "how tall?", 1.0, "lightweight", "r") is False and call.pending
    engine.gate.set()
    await call.wait()
    assert call.result.needs_check and not call.pending and engine.calls == 1 and call.ms > 0


async def test_failures_mean_check_it_and_overload_is_remembered() -> None:
    for fail, overloaded in ((Overloaded("full"), True), (InferenceError("broken"), False), (RuntimeError("bug"), False)):
        engine, call = Engine(fail=fail), SentinelCall()
        call.start(engine, "how tall?", 1.0, "lightweight", "r")
        engine.gate.set()
        await call.wait()  # never raises
        assert call.result is None and call.overloaded is overloaded


async def test_a_slow_model_times_out_and_a_gone_stream_cancels_it() -> None:
    call = SentinelCall()
    call.start(Engine(), "how tall?", 0.01, "lightweight", "r")  # the gate never opens
    await call.wait()
    assert call.result is None and not call.overloaded
    call2 = SentinelCall()
    call2.start(Engine(), "how tall?", 10.0, "lightweight", "r")
    task = call2.task
    call2.cancel()
    await asyncio.sleep(0)
    assert not call2.pending
    assert task.cancelled() or task.cancelling()
