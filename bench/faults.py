"""Fault injection through real Envoy: does every answer arrive whole while the sidecar is killed, frozen
and starved, the upstream is slow or cuts streams, and huge or hostile inputs are mixed in? (#19)

One run starts a scripted upstream (this module's `upstream` subcommand: every body is a function of a
case name and a seed, so the client knows to the byte what the upstream sent), `truthlens serve`, and
Envoy (fail-open, message_timeout 2 s); then it sends --requests requests from --clients concurrent
clients, JSON and SSE, while a controller injects faults in turn:

- kill: SIGKILL the sidecar, restart it on the same address (Envoy fails open meanwhile);
- freeze: SIGSTOP past Envoy's message_timeout, then SIGCONT (Envoy gives up on it and fails open);
- stall: SIGSTOP shorter than message_timeout but past inference_timeout_ms (detections time out);

and mixes in: slow JSON and slow streams, streams the upstream cuts mid-way, a context near the token
budget, 4 MB contexts and answers (JSON and SSE), upstream 500s, invalid JSON, lone surrogates and other
hostile text. Every body is checked against the upstream's (SHA-256, after removing the verdict event
TruthLens adds to streams): corrupted (differs), truncated (a strict prefix, the upstream having sent it
all), hung (no answer in --hang-s). It reports those counts, non-2xx statuses, verdicts by reason, the
sidecar's RSS (before / peak / after), and how long a normal request took while a 4 MB one was in.

    nice -n 10 .venv/bin/python -m bench.faults --requests 10000          # -> bench/results/faults.md
    nice -n 10 .venv/bin/python -m bench.faults --requests 500 --out /tmp/faults.md   # quick

--models tiny (default) serves the tests' tiny random models (tests/helpers/tiny_models.py: the gateway's
paths, not the models' cost, are under test, and 10,000 requests fit in minutes); --models bundled serves
models/ (sentinel, detector, explainer; no surrogate) for the memory and latency figures, --models
bundled-surrogate adds models/surrogate (about 0.9 GiB more).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.common import REPO, RESULTS, command, git_commit, machine, percentile, write_results
from extproc.devtools.processes import EnvoyProcess, free_port, terminate, wait_grpc_serving

MESSAGE_TIMEOUT_S = 2.0  # Envoy's, per ext_proc message
INFERENCE_TIMEOUT_MS = 500  # the sidecar's: under message_timeout, as in production (5 s under 10 s)
BIG = 4 * 1024 * 1024

SENTENCES = (
    "The Eiffel Tower is 330 metres tall.", "It was completed in 1889 for the World's Fair.",
    "Gustave Eiffel's company designed and built it.", "It is repainted every seven years.",
    "About seven million people visit it each year.", "It stands on the Champ de Mars in Paris.",
    "The tower was the tallest structure in the world until 1930.", "Its iron weighs about 7,300 tonnes.",
)
CONTEXT = " ".join(SENTENCES)
HOSTILE = ("caf\u00e9 \u202eRTL\u202c \u0000 nul \U0001f600 emoji \ufffd \u200b zero-width \\u and \\ud800 "
           "and \"quotes\" </script> \u2028 line sep")

# case -> weight in the mix (per 1000); the 4 MB cases are sent every BIG_EVERY requests instead
MIX = {
    "json": 300, "sse": 250, "json_nonfactual": 40, "json_ungrounded": 40, "json_slow": 30, "sse_slow": 60,
    "sse_cut": 40, "json_near_budget": 30, "json_hostile": 50, "sse_hostile": 40, "json_bad": 25,
    "json_500": 25, "json_hostile_request": 30,
}
BIG_CASES = ("json_big_context", "json_big_answer", "sse_big_answer", "sse_big_context")
BIG_EVERY = 250


@dataclass
class Plan:
    """What the upstream sends for one (case, seed): status, type, the body in chunks, pauses, a cut."""

    status: int
    content_type: str
    chunks: list[bytes]
    delay_s: float = 0.0  # before each chunk
    cut_after: int | None = None  # close the connection after this many chunks (no terminating chunk)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def sent(self) -> bytes:
        return b"".join(self.chunks if self.cut_after is None else self.chunks[: self.cut_after])


def answer_for(seed: int, n: int = 4) -> str:
    r = random.Random(seed)
    return " ".join(r.choice(SENTENCES) for _ in range(n))


def big_answer(seed: int) -> str:
    out, size, r = [], 0, random.Random(seed)
    while size < BIG - 64 * 1024:  # a 4 MB body in all
        s = r.choice(SENTENCES)
        out.append(s)
        size += len(s) + 1
    return " ".join(out)


def _completion(answer: str) -> bytes:
    return json.dumps({"id": "chatcmpl-f", "object": "chat.completion", "created": 1700000000, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": answer}}]}).encode()


def _sse(answer: str, per_chunk: int) -> list[bytes]:
    words = answer.split(" ")
    events = []
    for i in range(0, len(words), per_chunk):
        text = " ".join(words[i:i + per_chunk]) + (" " if i + per_chunk < len(words) else "")
        events.append(b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1700000000,
                                             "model": "m", "choices": [{"index": 0, "delta": {"content": text},
                                                                        "finish_reason": None}]}).encode() + b"\n\n")
    events.append(b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1700000000,
                                         "model": "m", "choices": [{"index": 0, "delta": {},
                                                                    "finish_reason": "stop"}]}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def _split(events: list[bytes], seed: int) -> list[bytes]:
    """Events regrouped into network chunks that split events at random places (as real upstreams do)."""
    data, r, out, pos = b"".join(events), random.Random(seed), [], 0
    while pos < len(data):
        n = r.randint(20, 400)
        out.append(data[pos:pos + n])
        pos += n
    return out


def plan_for(case: str, seed: int) -> Plan:
    sse = case.startswith("sse")
    if case == "json_500":
        return Plan(500, "application/json", [json.dumps({"error": {"message": f"upstream failed {seed}",
                                                                     "type": "server_error"}}).encode()])
    if case == "json_bad":
        return Plan(200, "application/json", [b'{"choices": [{"message": {"content": "cut' + str(seed).encode()])
    if case in ("json_big_answer", "sse_big_answer"):
        answer = big_answer(seed)
    elif case in ("json_hostile", "sse_hostile"):
        answer = f"{HOSTILE} {answer_for(seed)} {HOSTILE}"
    else:
        answer = answer_for(seed)
    if not sse:
        if case == "json_hostile":  # a lone surrogate escape and raw control characters, as some upstreams send
            body = _completion(answer).replace(b"\\\\ud800", b"\\ud800")
        else:
            body = _completion(answer)
        return Plan(200, "application/json", [body], delay_s=1.0 if case == "json_slow" else 0.0)
    if case == "sse_big_answer":
        data = b"".join(_sse(answer, 2000))
        return Plan(200, "text/event-stream", [data[i:i + 65536] for i in range(0, len(data), 65536)])
    chunks = _split(_sse(answer, 2), seed)
    if case == "sse_slow":
        return Plan(200, "text/event-stream", chunks, delay_s=0.05)
    if case == "sse_cut":
        return Plan(200, "text/event-stream", chunks, delay_s=0.02, cut_after=max(1, len(chunks) // 2))
    return Plan(200, "text/event-stream", chunks)


def request_for(case: str, seed: int) -> dict[str, Any]:
    question = "How tall is the Eiffel Tower and when was it built?"
    body: dict[str, Any] = {"model": "m", "stream": case.startswith("sse"),
                            "messages": [{"role": "user", "content": question}]}
    if case == "json_nonfactual":
        body["messages"][0]["content"] = "Write a short poem about the sea."
        return body
    if case == "json_ungrounded":
        return body
    if case in ("json_big_context", "sse_big_context"):
        body["truthlens_context"] = [(CONTEXT + " ") * (BIG // (len(CONTEXT) + 1))]
    elif case == "json_near_budget":
        body["truthlens_context"] = [(CONTEXT + " ") * 220]  # ~60k characters: under the budget's 131k
    elif case == "json_hostile_request":
        body["messages"][0]["content"] = f"{HOSTILE} {question}"
        body["truthlens_context"] = [f"{HOSTILE} {CONTEXT}"]
    else:
        body["truthlens_context"] = [CONTEXT]
    return body


# ---- the scripted upstream (a subprocess) --------------------------------------------------------------

async def _read_request(reader: asyncio.StreamReader) -> dict[str, str]:
    head = await reader.readuntil(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower().decode()] = value.strip().decode()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif int(headers.get("content-length", 0)):
        await reader.readexactly(int(headers["content-length"]))
    return headers


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            headers = await _read_request(reader)
            plan = plan_for(headers.get("x-bench-case", "json"), int(headers.get("x-bench-seed", "0")))
            if plan.content_type == "text/event-stream":
                writer.write(b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                             % plan.status)
                for i, chunk in enumerate(plan.chunks):
                    if plan.cut_after is not None and i == plan.cut_after:
                        await writer.drain()
                        writer.transport.abort()  # mid-stream: no terminating chunk
                        return
                    if plan.delay_s:
                        await asyncio.sleep(plan.delay_s)
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                if plan.delay_s:
                    await asyncio.sleep(plan.delay_s)
                body = plan.body
                writer.write(b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                             % (plan.status, plan.content_type.encode(), len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def _upstream_main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024, limit=1 << 20)
    async with server:
        await server.serve_forever()


# ---- the sidecar, its faults and its memory ------------------------------------------------------------

class Sidecar:
    """`truthlens serve` on a fixed address; kill/restart, freeze; RSS sampled by a thread."""

    def __init__(self, config: Path) -> None:
        self.config, self.address = config, f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.rss_mb: list[tuple[float, float]] = []  # (time, MB)
        self.events: list[tuple[float, str]] = []
        self.envoy_pid, self.envoy_peak_mb = 0, 0.0  # Envoy's RSS is sampled beside
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        cmd = [sys.executable, "-m", "extproc.commands.serve", "--config", str(self.config), "--grpc-address",
               self.address, "--metrics-address", f"127.0.0.1:{free_port()}", "--log-level", "error"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_grpc_serving(self.address, 300, self.proc):
            raise RuntimeError("the sidecar did not start")
        if not self._sampler.is_alive():
            self._sampler.start()

    def rss_now(self) -> float:
        return rss_mb(self.proc.pid) if self.proc else 0.0

    def _sample(self) -> None:
        while not self._stop.is_set():
            mb = self.rss_now()
            if mb:
                self.rss_mb.append((time.monotonic(), mb))
            if self.envoy_pid:
                self.envoy_peak_mb = max(self.envoy_peak_mb, rss_mb(self.envoy_pid))
            self._stop.wait(0.1)

    def kill_and_restart(self) -> None:
        assert self.proc is not None
        self.events.append((time.monotonic(), "kill"))
        self.proc.kill()
        self.proc.wait()
        time.sleep(0.5)
        self.start()
        self.events.append((time.monotonic(), "restarted"))

    def freeze(self, seconds: float, what: str) -> None:
        assert self.proc is not None
        self.events.append((time.monotonic(), what))
        os.kill(self.proc.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)
            terminate(self.proc)


# ---- the client and the checks -------------------------------------------------------------------------

@dataclass
class Outcome:
    case: str
    status: int = 0
    verdict: str = "none"  # status[/reason] from the headers or the stream's verdict event; none: no verdict
    result: str = "ok"  # ok | corrupted | truncated | reset | hung | cut_ok (the upstream cut it: a clean prefix)
    latency_s: float = 0.0
    error: str = ""
    started: float = 0.0


TRUTHLENS_EVENT = re.compile(rb'^data: \{.*"truthlens":', re.S)


def strip_verdict_events(body: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """The stream without the events TruthLens inserted, and the verdict they carried."""
    out, verdict = [], None
    for event in re.split(rb"(?<=\n\n)", body):
        if event and TRUTHLENS_EVENT.match(event) and event.endswith(b"\n\n"):
            try:
                verdict = json.loads(event[6:])["truthlens"]
                continue
            except (ValueError, KeyError, TypeError):
                pass
        out.append(event)
    return b"".join(out), verdict


def judge(case: str, plan: Plan, status: int, headers: dict[str, str], body: bytes, failed: bool) -> Outcome:
    o = Outcome(case, status)
    got = body
    if plan.content_type == "text/event-stream" and status == 200:
        got, verdict = strip_verdict_events(body)
        if verdict is not None:
            o.verdict = verdict["status"] + (f"/{verdict['reason']}" if verdict.get("reason") else "")
    if o.verdict == "none" and "x-truthlens-status" in headers:
        o.verdict = headers["x-truthlens-status"] + (f"/{headers['x-truthlens-reason']}"
                                                     if headers.get("x-truthlens-reason") else "")
    if plan.cut_after is not None:  # a 5xx: the upstream reset before Envoy sent the headers on (its own reply)
        o.result = "cut_5xx" if status >= 500 else "cut_ok" if plan.sent.startswith(got) else "corrupted"
    elif got == plan.body and not failed:
        o.result = "ok"
    elif plan.body.startswith(got):
        o.result = "truncated"
    else:
        o.result = "corrupted"
    return o


async def send(url: str, case: str, seed: int, hang_s: float) -> Outcome:
    reader = writer = None
    plan = plan_for(case, seed)
    payload = json.dumps(request_for(case, seed)).encode()
    t0 = time.monotonic()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            f"x-bench-case: {case}\r\nx-bench-seed: {seed}\r\ncontent-length: {len(payload)}\r\n"
            f"connection: close\r\n\r\n").encode()
    try:
        async with asyncio.timeout(hang_s):
            host, port = url.split("//")[1].split(":")
            reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
            writer.write(head + payload)
            await writer.drain()
            raw = await reader.read(-1)  # connection: close -> the whole response
    except TimeoutError:
        o = Outcome(case, result="hung", latency_s=time.monotonic() - t0, started=t0)
        return o
    except (ConnectionError, OSError) as exc:  # reset before a whole response arrived
        return Outcome(case, result="reset" if plan.cut_after is None else "cut_ok", error=repr(exc),
                       latency_s=time.monotonic() - t0, started=t0)
    finally:
        if writer is not None:
            writer.close()
    head_end = raw.find(b"\r\n\r\n")
    status_line, *lines = raw[:head_end].decode("latin-1").split("\r\n")
    status = int(status_line.split()[1]) if status_line.startswith("HTTP/") else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    rest, failed = raw[head_end + 4:], False
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body, pos = bytearray(), 0
        while True:
            eol = rest.find(b"\r\n", pos)
            if eol < 0:
                failed = True
                break
            size = int(rest[pos:eol].split(b";")[0] or b"0", 16)
            if size == 0:
                break
            if eol + 2 + size + 2 > len(rest):
                body += rest[eol + 2:eol + 2 + size]
                failed = True
                break
            body += rest[eol + 2:eol + 2 + size]
            pos = eol + 2 + size + 2
        body = bytes(body)
    else:
        body = rest
        if "content-length" in headers and len(body) != int(headers["content-length"]):
            failed = True
    o = judge(case, plan, status, headers, body, failed)
    o.latency_s, o.started = time.monotonic() - t0, t0
    return o


def build_mix(n: int, seed: int) -> list[tuple[str, int]]:
    r = random.Random(seed)
    names, weights = list(MIX), list(MIX.values())
    out = []
    for i in range(n):
        if i % BIG_EVERY == BIG_EVERY // 2:
            out.append((BIG_CASES[(i // BIG_EVERY) % len(BIG_CASES)], i))
        else:
            out.append((r.choices(names, weights)[0], i))
    return out


async def run_load(url: str, mix: list[tuple[str, int]], clients: int, hang_s: float,
                   progress: bool) -> list[Outcome]:
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for item in mix:
        queue.put_nowait(item)
    out: list[Outcome] = []

    async def client() -> None:
        while not queue.empty():
            case, seed = queue.get_nowait()
            out.append(await send(url, case, seed, hang_s))
            if progress and len(out) % 1000 == 0:
                print(f"  {len(out)} / {len(mix)} requests", flush=True)

    await asyncio.gather(*(client() for _ in range(clients)))
    return out


async def probe_big(url: str, hang_s: float, burst: int) -> list[dict[str, Any]]:
    """A normal grounded request sent 100 ms after each 4 MB one: how long it took and its verdict. Then the
    worst case for memory: `burst` of each 4 MB request at once (JSON and SSE, context and answer)."""
    rows = []
    for big in BIG_CASES:
        t0 = time.monotonic()
        big_task = asyncio.ensure_future(send(url, big, 7, hang_s))
        await asyncio.sleep(0.1)
        normal = await send(url, "json", 11, hang_s)
        b = await big_task
        rows.append({"big": big, "big_verdict": b.verdict, "big_result": b.result, "big_s": round(b.latency_s, 3),
                     "normal_after_s": round(normal.latency_s, 3), "normal_verdict": normal.verdict,
                     "normal_result": normal.result, "t": round(time.monotonic() - t0, 3)})
    if burst:
        t0 = time.monotonic()
        big = [asyncio.ensure_future(send(url, case, 100 + i, hang_s)) for case in BIG_CASES for i in range(burst)]
        await asyncio.sleep(0.1)
        normal = await send(url, "json", 12, hang_s)
        done = await asyncio.gather(*big)
        rows.append({"big": f"{burst} x each at once", "big_verdict": ",".join(sorted({o.verdict for o in done})),
                     "big_result": ",".join(sorted({o.result for o in done})),
                     "big_s": round(max(o.latency_s for o in done), 3), "normal_after_s": round(normal.latency_s, 3),
                     "normal_verdict": normal.verdict, "normal_result": normal.result,
                     "t": round(time.monotonic() - t0, 3)})
    return rows


def fault_loop(sidecar: Sidecar, stop: threading.Event, every_s: float) -> None:
    faults = ("kill", "freeze", "stall")
    i = 0
    while not stop.wait(every_s):
        what = faults[i % len(faults)]
        i += 1
        try:
            if what == "kill":
                sidecar.kill_and_restart()
            elif what == "freeze":
                sidecar.freeze(MESSAGE_TIMEOUT_S + 1.5, "freeze")  # past message_timeout: Envoy fails open
            else:
                sidecar.freeze(INFERENCE_TIMEOUT_MS / 1000 + 0.4, "stall")  # detections time out, Envoy waits
        except Exception as exc:  # noqa: BLE001 - a fault that failed is reported, the run goes on
            sidecar.events.append((time.monotonic(), f"{what} failed: {exc!r}"))


def rss_mb(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / (1024 * 1024)
    except psutil.Error:
        return 0.0


def model_dirs(kind: str, work: Path) -> dict[str, str | None]:
    if kind in ("bundled", "bundled-surrogate"):
        return {"sentinel": "models/sentinel", "detector": "models/detector", "explainer": "models/explainer",
                "surrogate": "models/surrogate" if kind == "bundled-surrogate" else None}
    from tests.helpers.tiny_models import TinyModels  # run from the repository root (python -m bench.faults)

    tiny = TinyModels(work / "tiny")
    return {"sentinel": str(tiny["bert-seq"]), "detector": str(tiny["bert-token"]),
            "explainer": str(tiny["bert-nli"]), "surrogate": None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="run", choices=["run", "upstream"])
    p.add_argument("--port", type=int, default=0, help="upstream mode: the port")
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--clients", type=int, default=48)
    p.add_argument("--models", choices=["tiny", "bundled", "bundled-surrogate"], default="tiny")
    p.add_argument("--fault-every-s", type=float, default=6.0, help="seconds between faults (0: none)")
    p.add_argument("--hang-s", type=float, default=60.0, help="a request not answered within this is hung")
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--burst", type=int, default=4, help="after the run: this many of each 4 MB request at once")
    p.add_argument("--out", default=str(RESULTS / "faults.md"))
    args = p.parse_args()
    if args.mode == "upstream":
        asyncio.run(_upstream_main(args.port))
        return
    with tempfile.TemporaryDirectory(prefix="truthlens-faults-") as tmp:
        work = Path(tmp)
        dirs = model_dirs(args.models, work)
        config = work / "truthlens.yaml"
        config.write_text(json.dumps({"truthlens": {"inference_timeout_ms": INFERENCE_TIMEOUT_MS, "models": dirs}}))
        report = run(args, config)
    path = write_results(args.out, markdown(report), report)
    print(f"wrote {path}")


def run(args: argparse.Namespace, config: Path) -> dict[str, Any]:
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.faults", "upstream", "--port", str(up_port)], cwd=REPO)
    sidecar = Sidecar(config)
    envoy = None
    stop = threading.Event()
    try:
        sidecar.start()
        envoy = EnvoyProcess(sidecar.address, f"http://127.0.0.1:{up_port}", failure_mode_allow=True,
                             message_timeout_s=MESSAGE_TIMEOUT_S, concurrency=2).start()
        sidecar.envoy_pid = envoy.proc.pid if envoy.proc else 0
        url = envoy.base_url
        warm = asyncio.run(run_load(url, build_mix(200, args.seed + 1), 8, args.hang_s, False))
        time.sleep(1.0)
        rss_before = sidecar.rss_now()
        t_start = time.monotonic()
        mix = build_mix(args.requests, args.seed)
        faults = threading.Thread(target=fault_loop, args=(sidecar, stop, args.fault_every_s), daemon=True)
        if args.fault_every_s > 0:
            faults.start()
        outcomes = asyncio.run(run_load(url, mix, args.clients, args.hang_s, True))
        stop.set()
        if faults.is_alive():
            faults.join()
        elapsed = time.monotonic() - t_start
        time.sleep(2.0)
        t_probe = time.monotonic()
        probes = asyncio.run(probe_big(url, args.hang_s, args.burst))
        time.sleep(2.0)
        rss_after = sidecar.rss_now()
        peak = max((mb for t, mb in sidecar.rss_mb if t >= t_start), default=0.0)
        probe_peak = max((mb for t, mb in sidecar.rss_mb if t >= t_probe), default=0.0)
    finally:
        stop.set()
        if envoy is not None:
            envoy.stop()
        sidecar.stop()
        terminate(upstream)
    report = summarize(args, outcomes, warm, probes, sidecar, rss_before, peak, rss_after, elapsed, t_start)
    report["rss_mb"]["peak_4mb_probes"] = round(probe_peak)
    report["rss_mb"]["envoy_peak"] = round(sidecar.envoy_peak_mb)
    return report


def summarize(args: argparse.Namespace, outcomes: list[Outcome], warm: list[Outcome], probes: list[dict[str, Any]],
              sidecar: Sidecar, rss_before: float, peak: float, rss_after: float, elapsed: float,
              t_start: float) -> dict[str, Any]:
    by_case: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_case.setdefault(o.case, Counter())[o.result] += 1
    sent_status = {c: plan_for(c, 0).status for c in {o.case for o in outcomes}}
    kinds = {"json": [o for o in outcomes if o.case.startswith("json")],
             "sse": [o for o in outcomes if o.case.startswith("sse")]}
    counts = {k: {"requests": len(v),
                  "non_2xx": sum(1 for o in v if not 200 <= o.status < 300),
                  "non_2xx_not_from_upstream": sum(1 for o in v if o.status != sent_status[o.case]
                                                   and o.result not in ("hung", "reset", "cut_ok", "cut_5xx")),
                  "corrupted": sum(1 for o in v if o.result == "corrupted"),
                  "truncated": sum(1 for o in v if o.result == "truncated"),
                  "reset": sum(1 for o in v if o.result == "reset"),
                  "hung": sum(1 for o in v if o.result == "hung"),
                  "cut_by_upstream_clean_prefix": sum(1 for o in v if o.result == "cut_ok"),
                  "cut_by_upstream_before_headers_5xx": sum(1 for o in v if o.result == "cut_5xx")}
              for k, v in kinds.items()}
    verdicts = Counter(o.verdict for o in outcomes)
    lat = [o.latency_s for o in outcomes]
    return {
        "machine": machine(), "command": command("bench.faults"), "commit": git_commit(), "models": args.models,
        "clients": args.clients, "message_timeout_s": MESSAGE_TIMEOUT_S, "inference_timeout_ms": INFERENCE_TIMEOUT_MS,
        "elapsed_s": round(elapsed, 1), "requests": len(outcomes), "counts": counts,
        "verdicts": dict(verdicts.most_common()),
        "by_case": {c: dict(v) for c, v in sorted(by_case.items())},
        "latency_s": {"p50": round(percentile(lat, 0.5), 3), "p99": round(percentile(lat, 0.99), 3),
                      "max": round(max(lat), 3)},
        "faults": [(round(t - t_start, 1), what) for t, what in sidecar.events],
        "rss_mb": {"before": round(rss_before), "peak": round(peak), "after": round(rss_after)},
        "big_probes": probes, "warmup_requests": len(warm),
        "errors": Counter(o.error.split("(")[0] for o in outcomes if o.error).most_common(5),
    }


def markdown(r: dict[str, Any]) -> str:
    c = r["counts"]
    lines = [
        "# Fault injection through real Envoy (#19)", "",
        f"Machine: {r['machine']}  ", f"Command: `{r['command']}` (commit {r['commit']}, models: {r['models']})  ",
        f"{r['requests']} requests from {r['clients']} clients in {r['elapsed_s']} s; Envoy fail-open, "
        f"message_timeout {r['message_timeout_s']:g} s; sidecar inference_timeout_ms {r['inference_timeout_ms']}.", "",
        "| | JSON | SSE |", "|---|---:|---:|",
    ]
    for key in ("requests", "non_2xx", "non_2xx_not_from_upstream", "corrupted", "truncated", "reset", "hung",
                "cut_by_upstream_clean_prefix", "cut_by_upstream_before_headers_5xx"):
        lines.append(f"| {key.replace('_', ' ')} | {c['json'][key]} | {c['sse'][key]} |")
    lines += ["", "non-2xx: the upstream's own 500s (case json_500) pass through as sent; `not from upstream` counts "
              "statuses the upstream did not send. reset: the connection closed before a whole response. cut by upstream: streams the upstream aborted mid-way; the "
              "client got a clean prefix of what was sent (or, when the reset came before Envoy sent the "
              "response headers on, Envoy's own 5xx).", "",
              "Verdicts (x-truthlens-status/reason, or the stream's verdict event; `none`: no verdict, the "
              "sidecar was down or frozen and Envoy failed open):", "",
              "| verdict | requests |", "|---|---:|"]
    lines += [f"| {v} | {n} |" for v, n in r["verdicts"].items()]
    rss = r["rss_mb"]
    lines += ["", f"Sidecar RSS: before {rss['before']} MB, peak {rss['peak']} MB, after {rss['after']} MB "
              f"(VmRSS sampled every 100 ms, across restarts); peak while the 4 MB requests below ran: "
              f"{rss.get('peak_4mb_probes', '-')} MB. Envoy's RSS peaked at {rss.get('envoy_peak', '-')} MB.", "",
              f"Latency: p50 {r['latency_s']['p50']} s, p99 {r['latency_s']['p99']} s, max {r['latency_s']['max']} s "
              "(slow upstream cases and faults included).", "",
              "Faults injected (seconds into the run): " + ", ".join(f"{t} {w}" for t, w in r["faults"]), "",
              "A normal grounded request sent 100 ms after a 4 MB one (no faults; last row: the burst):", "",
              "| 4 MB request | its verdict | its result | normal request took s | its verdict |",
              "|---|---|---|---:|---|"]
    lines += [f"| {p['big']} | {p['big_verdict']} | {p['big_result']} | {p['normal_after_s']} | {p['normal_verdict']} |"
              for p in r["big_probes"]]
    lines += ["", "By case (result counts):", "", "| case | results |", "|---|---|"]
    lines += [f"| {case} | {', '.join(f'{k} {v}' for k, v in res.items())} |" for case, res in r["by_case"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
