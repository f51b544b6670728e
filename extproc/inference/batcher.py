"""Request coalescing: one worker thread per model, token-budgeted batches, futures.

Inference never runs on the event loop: `submit` enqueues a job and awaits
an asyncio future that the worker resolves with `call_soon_threadsafe`.
onnxruntime releases the GIL during `run`, so the loop stays responsive.

- Coalescing: jobs that queue while a batch runs go into the next batch
  together, up to max_batch_tokens (the model sorts rows by length and
  sub-batches by padded size). When the worker is free it lingers for more
  only while jobs arrive faster than half a batch's run time, and never past
  max_wait_ms after the first job: a lone request (concurrency 1) runs at
  once instead of always paying the wait, a burst still coalesces.
- Cancellation: a job whose future was cancelled (caller timed out or the
  stream went away) leaves the queue at once (its slot and tokens are free
  for others) and is never run; one the worker already took is dropped
  before the forward pass; one job larger than max_batch_tokens (a long
  context's windows: it runs alone) runs in slices of at most that, and
  stops between slices once its caller is gone.
- Admission: more than max_queue jobs queued or in flight, or more than
  max_queued_tokens waiting to run -> `Overloaded` at once, so the gateway
  passes the response through marked unchecked instead of queueing forever.
- Crashes: a failing batch fails its own futures; if the worker loop itself
  dies, every pending future gets an error and later submits are refused.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from extproc.inference.api import InferenceError, Overloaded

log = logging.getLogger(__name__)

RunFn = Callable[[Sequence[Any]], Sequence[Any]]


@dataclass(eq=False)
class _Job:
    items: Sequence[Any]
    tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)


def _ewma(average: float, sample: float, first: bool = False, alpha: float = 0.2) -> float:
    if first or average == float("inf"):
        return sample
    return average + alpha * (sample - average)


def linger_s(remaining_s: float, gap_s: float, run_s: float) -> float:
    """How long a free worker should wait for another job before running what it has.

    Waiting pays only when the next job is expected well within a batch's run time
    (it then shares that run instead of queueing behind it); a lone request, or
    traffic sparser than that, runs at once. Never longer than the max_wait left.
    """
    if remaining_s <= 0 or gap_s >= 0.5 * run_s:
        return 0.0
    return min(remaining_s, 2.0 * gap_s)


def _resolve(fut: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if fut.done():  # cancelled meanwhile
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class Batcher:
    """Coalesces concurrent jobs (lists of rows) for one model's `run` function."""

    def __init__(
        self,
        run: RunFn,
        name: str,
        max_batch_tokens: int = 16384,
        max_wait_ms: float = 2.0,
        max_queue: int = 256,
        size: Callable[[Any], int] = len,
        max_queued_tokens: int | None = None,  # None: only max_queue bounds the queue
    ) -> None:
        self._run = run
        self.name = name
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.max_queued_tokens = max_queued_tokens
        self._size = size
        self._queue: collections.deque[_Job] = collections.deque()
        self._queued_tokens = 0
        self._pending = 0  # queued + in flight
        self._cv = threading.Condition()
        self._closed = False
        self._dead: BaseException | None = None
        self._inflight: list[_Job] = []
        self._last_arrival = 0.0
        self._gap_s = float("inf")  # moving average of the time between job arrivals
        self._run_s = 0.0  # moving average of a batch's run time
        self.batches = 0  # counters for tests and metrics
        self.dropped = 0
        self._thread = threading.Thread(target=self._worker, name=f"truthlens-{name}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    async def submit(self, items: Sequence[Any]) -> list[Any]:
        """Run `items` in some batch; results in the same order."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        job = _Job(items, sum(self._size(i) for i in items), loop.create_future(), loop)
        with self._cv:
            if self._dead is not None or self._closed:
                raise InferenceError(f"{self.name} batcher is not running ({self._dead or 'closed'})")
            if self._pending >= self.max_queue:
                raise Overloaded(f"{self.name}: {self._pending} requests pending (max_queue {self.max_queue})")
            if (self.max_queued_tokens is not None and self._queue
                    and self._queued_tokens + job.tokens > self.max_queued_tokens):
                raise Overloaded(f"{self.name}: {self._queued_tokens} tokens queued, {job.tokens} more would pass "
                                 f"max_queued_tokens {self.max_queued_tokens}")
            self._pending += 1
            if self._last_arrival:
                self._gap_s = _ewma(self._gap_s, job.enqueued - self._last_arrival)
            self._last_arrival = job.enqueued
            self._queue.append(job)
            self._queued_tokens += job.tokens
            self._cv.notify()
        job.future.add_done_callback(lambda fut: self._withdraw(job) if fut.cancelled() else None)
        return await job.future

    def _withdraw(self, job: _Job) -> None:
        """The caller gave up (timeout, stream gone): a job still queued leaves now, never runs, and frees its
        slot and tokens for others. One the worker took already is the worker's to drop or finish."""
        with self._cv:
            try:
                self._queue.remove(job)
            except ValueError:
                return
            self._queued_tokens -= job.tokens
            self._pending -= 1
            self.dropped += 1

    def _take(self) -> list[_Job]:
        """Block for the first job, linger up to max_wait for more, take up to the token budget."""
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return []
            deadline = self._queue[0].enqueued + self.max_wait_s
            while self._queued_tokens < self.max_batch_tokens and not self._closed:
                patience = linger_s(deadline - time.perf_counter(), self._gap_s, self._run_s)
                if patience <= 0:
                    break
                queued = len(self._queue)
                self._cv.wait(patience)
                if len(self._queue) == queued:
                    break  # nobody came within the expected gap: stop waiting
            jobs, tokens = [], 0
            while self._queue and (not jobs or tokens + self._queue[0].tokens <= self.max_batch_tokens):
                job = self._queue.popleft()
                self._queued_tokens -= job.tokens
                tokens += job.tokens
                jobs.append(job)
            return jobs

    def _finish(self, jobs: Sequence[_Job], results: Sequence[Any] | None, error: BaseException | None) -> None:
        # Give the capacity back before waking the callers: a caller that submits again
        # as soon as its result arrives must not be refused for its own finished job.
        with self._cv:
            self._pending -= len(jobs)
        offset = 0
        for job in jobs:
            n = len(job.items)
            value = None if results is None else list(results[offset : offset + n])
            offset += n
            try:
                job.loop.call_soon_threadsafe(_resolve, job.future, value, error)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting
                pass

    def _worker(self) -> None:
        try:
            while True:
                jobs = self._take()
                if not jobs:
                    return  # closed and drained
                live = [j for j in jobs if not j.future.cancelled()]
                if len(live) < len(jobs):
                    with self._cv:  # _withdraw counts on the loop's thread
                        self.dropped += len(jobs) - len(live)
                    self._finish([j for j in jobs if j.future.cancelled()], None, None)
                if not live:
                    continue
                items = [item for j in live for item in j.items]
                self._inflight = live
                started = time.perf_counter()
                try:
                    if len(live) == 1 and live[0].tokens > self.max_batch_tokens:
                        results = self._run_sliced(live[0])
                        if results is None:  # its caller gave up between slices: the rest never runs
                            with self._cv:
                                self.dropped += 1
                            self._finish(live, None, None)
                            self._inflight = []
                            continue
                    else:
                        results = self._run(items)
                    if len(results) != len(items):
                        raise InferenceError(f"{self.name}: model returned {len(results)} results for {len(items)} rows")
                except Exception as exc:  # noqa: BLE001 - the batch fails, the worker lives on
                    log.exception("%s batch of %d rows failed", self.name, len(items))
                    self._finish(live, None, exc if isinstance(exc, InferenceError) else InferenceError(f"{self.name}: {exc}"))
                else:
                    self.batches += 1
                    self._run_s = _ewma(self._run_s, time.perf_counter() - started, first=self.batches == 1)
                    self._finish(live, results, None)
                self._inflight = []
        except BaseException as exc:  # the loop itself broke: never leave a future unresolved
            self._dead = exc
            log.exception("%s batcher worker died", self.name)
            error = InferenceError(f"{self.name} worker died: {exc!r}")
            inflight, self._inflight = self._inflight, []
            self._finish(inflight, None, error)
            self._fail_all(error)

    def _run_sliced(self, job: _Job) -> list[Any] | None:
        """A job over max_batch_tokens in slices of at most that; None when its future was cancelled meanwhile."""
        out: list[Any] = []
        piece: list[Any] = []
        tokens = 0
        for item in job.items:
            n = self._size(item)
            if piece and tokens + n > self.max_batch_tokens:
                out += list(self._run(piece))
                piece, tokens = [], 0
                if job.future.cancelled():
                    return None
            piece.append(item)
            tokens += n
        out += list(self._run(piece))
        return out

    def _fail_all(self, error: InferenceError) -> None:
        with self._cv:
            jobs = list(self._queue)
            self._queue.clear()
            self._queued_tokens = 0
        self._finish(jobs, None, error)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, let queued jobs finish, join the worker; leftovers get an error."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)
        self._fail_all(InferenceError(f"{self.name} batcher closed"))
