import asyncio
import threading

import pytest

from extproc.inference.api import InferenceError, Overloaded
from extproc.inference.batcher import Batcher


class Recorder:
    """A run function that records batches and can be held on a gate."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.thread_names: set[str] = set()

    def __call__(self, items):
        self.thread_names.add(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(10)
        self.batches.append(list(items))
        return [f"out:{x}" for x in items]


async def _wait_for(event: threading.Event) -> None:
    await asyncio.get_running_loop().run_in_executor(None, event.wait, 10)


async def test_results_come_back_in_order_and_off_the_event_loop():
    rec = Recorder()
    b = Batcher(rec, "t", max_wait_ms=0)
    try:
        assert await b.submit(["a", "bb", "c"]) == ["out:a", "out:bb", "out:c"]
        assert rec.thread_names == {"truthlens-t"}
    finally:
        b.close()


async def test_concurrent_jobs_coalesce_into_one_batch_while_the_worker_is_busy():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, "t", max_wait_ms=0)
    try:
        first = asyncio.ensure_future(b.submit(["x"]))
        await _wait_for(rec.entered)  # worker now blocked inside batch 1
        rest = [asyncio.ensure_future(b.submit([f"r{i}"])) for i in range(5)]
        await asyncio.sleep(0)
        rec.gate.set()
        assert await first == ["out:x"]
        assert [await r for r in rest] == [[f"out:r{i}"] for i in range(5)]
        assert rec.batches == [["x"], [f"r{i}" for i in range(5)]]
    finally:
        b.close()


async def test_token_budget_bounds_a_batch():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, "t", max_wait_ms=0, max_batch_tokens=4)
    try:
        first = asyncio.ensure_future(b.submit(["xxxx"]))
        await _wait_for(rec.entered)
        rest = [asyncio.ensure_future(b.submit(["yy"])) for _ in range(3)]
        await asyncio.sleep(0)
        rec.gate.set()
        await asyncio.gather(first, *rest)
        assert [len(batch) for batch in rec.batches] == [1, 2, 1]
    finally:
        b.close()


async def test_admission_limit_answers_overloaded_instead_of_queueing():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, "t", max_wait_ms=0, max_queue=2)
    try:
        jobs = [asyncio.ensure_future(b.submit([str(i)])) for i in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="max_queue 2"):
            await b.submit(["late"])
        rec.gate.set()
        await asyncio.gather(*jobs)
        assert await b.submit(["after"]) == ["out:after"]  # capacity is given back
    finally:
        rec.gate.set()
        b.close()


async def test_cancelled_request_work_is_dropped():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, "t", max_wait_ms=0)
    try:
        first = asyncio.ensure_future(b.submit(["keep1"]))
        await _wait_for(rec.entered)
        doomed = asyncio.ensure_future(b.submit(["drop"]))
        kept = asyncio.ensure_future(b.submit(["keep2"]))
        await asyncio.sleep(0)
        doomed.cancel()
        rec.gate.set()
        await asyncio.gather(first, kept)
        assert ["drop"] not in rec.batches and all("drop" not in batch for batch in rec.batches)
        assert b.dropped == 1
        assert b.pending == 0
    finally:
        b.close()


async def test_cancelled_work_leaves_the_queue_at_once_while_the_worker_is_busy():
    """#19: a request that timed out must not hold a queue slot or queued tokens until the worker gets to it:
    with the worker stuck in a long batch, cancelled jobs free their capacity immediately for other requests."""
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, "t", max_wait_ms=0, max_queue=3, max_queued_tokens=8)
    try:
        first = asyncio.ensure_future(b.submit(["long"]))
        await _wait_for(rec.entered)  # the worker is inside a batch
        doomed = [asyncio.ensure_future(b.submit(["xxxx"])) for _ in range(2)]
        await asyncio.sleep(0)
        assert b.pending == 3 and b.queued_tokens == 8
        with pytest.raises(Overloaded):
            await b.submit(["y"])
        for d in doomed:
            d.cancel()
        await asyncio.sleep(0)
        assert b.pending == 1 and b.queued_tokens == 0  # gone before the worker is free again
        assert b.dropped == 2
        kept = asyncio.ensure_future(b.submit(["kept"]))  # the freed room serves another request
        await asyncio.sleep(0)
        rec.gate.set()
        assert await kept == ["out:kept"] and await first == ["out:long"]
        assert all("xxxx" not in batch for batch in rec.batches)
        assert b.pending == 0 and b.queued_tokens == 0
    finally:
        rec.gate.set()
        b.close()


async def test_a_job_over_the_batch_budget_runs_in_slices_and_stops_when_its_caller_goes():
    """#19: a request's long context ran as one forward pass that kept going after the request timed out. A job
    over max_batch_tokens runs in slices of at most that, and the slices after its caller left never run."""
    rec = Recorder()
    b = Batcher(rec, "t", max_wait_ms=0, max_batch_tokens=4)
    try:
        assert await b.submit(["aa", "bb", "cc", "dd", "e"]) == ["out:aa", "out:bb", "out:cc", "out:dd", "out:e"]
        assert rec.batches == [["aa", "bb"], ["cc", "dd"], ["e"]]
        rec.batches.clear()
        rec.gate.clear()
        rec.entered.clear()
        doomed = asyncio.ensure_future(b.submit(["aa", "bb", "cc", "dd", "ee", "ff"]))
        await _wait_for(rec.entered)  # inside the first slice
        doomed.cancel()
        await asyncio.sleep(0.01)
        rec.gate.set()
        assert await b.submit(["ok"]) == ["out:ok"]
        assert rec.batches == [["aa", "bb"], ["ok"]]  # the other two slices never ran
        assert b.dropped == 1 and b.pending == 0
    finally:
        rec.gate.set()
        b.close()


async def test_queued_tokens_are_capped():
    """max_queued_tokens: work waiting to run is bounded in tokens, not only in requests (#19)."""
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, "t", max_wait_ms=0, max_queued_tokens=10)
    try:
        first = asyncio.ensure_future(b.submit(["running"]))
        await _wait_for(rec.entered)
        queued = asyncio.ensure_future(b.submit(["x" * 8]))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="max_queued_tokens 10"):
            await b.submit(["abc"])
        small = asyncio.ensure_future(b.submit(["ab"]))  # fits in what is left
        await asyncio.sleep(0)
        rec.gate.set()
        await asyncio.gather(first, queued, small)
        assert b.queued_tokens == 0
    finally:
        rec.gate.set()
        b.close()


async def test_failing_batch_fails_its_futures_and_the_worker_survives():
    calls = []

    def run(items):
        calls.append(items)
        if "boom" in items:
            raise ValueError("bad row")
        return items

    b = Batcher(run, "t", max_wait_ms=0)
    try:
        with pytest.raises(InferenceError, match="bad row"):
            await b.submit(["boom"])
        assert await b.submit(["ok"]) == ["ok"]
    finally:
        b.close()


async def test_worker_death_resolves_every_pending_future():
    started = threading.Event()
    release = threading.Event()

    def run(items):
        started.set()
        release.wait(10)
        raise SystemExit("worker killed")  # not an Exception: escapes the per-batch handler

    b = Batcher(run, "t", max_wait_ms=0)
    inflight = asyncio.ensure_future(b.submit(["a"]))
    await _wait_for(started)
    queued = asyncio.ensure_future(b.submit(["b"]))
    await asyncio.sleep(0)
    release.set()
    for fut in (inflight, queued):
        with pytest.raises(InferenceError, match="worker died"):
            await asyncio.wait_for(fut, 10)
    with pytest.raises(InferenceError, match="not running"):
        await b.submit(["c"])


async def test_close_fails_nothing_silently_and_refuses_new_work():
    b = Batcher(lambda items: items, "t", max_wait_ms=0)
    assert await b.submit(["1"]) == ["1"]
    b.close()
    with pytest.raises(InferenceError):
        await b.submit(["2"])


def test_linger_policy_waits_only_for_traffic_denser_than_a_batch():
    from extproc.inference.batcher import linger_s

    assert linger_s(0.002, float("inf"), 0.004) == 0.0  # no arrival history: run at once
    assert linger_s(0.002, 0.003, 0.004) == 0.0  # sparser than half a run (concurrency 1): run at once
    assert linger_s(0.002, 0.0001, 0.004) == pytest.approx(0.0002)  # a burst: wait about one gap more
    assert linger_s(0.002, 0.0015, 0.010) == pytest.approx(0.002)  # never past max_wait
    assert linger_s(0.0, 0.0001, 0.004) == 0.0


async def test_a_lone_request_does_not_wait_out_max_wait():
    """max_wait is a bound, not a fee: with a 60 s max_wait a single request still returns at once."""
    rec = Recorder()
    b = Batcher(rec, "t", max_wait_ms=60_000)
    try:
        for i in range(3):  # sequential callers, as at concurrency 1
            assert await asyncio.wait_for(b.submit([f"q{i}"]), timeout=10) == [f"out:q{i}"]
        assert rec.batches == [["q0"], ["q1"], ["q2"]]
    finally:
        b.close()
