"""Gateway overhead: bare Envoy vs Envoy + do-nothing ext_proc vs Envoy + TruthLens (non-factual prompt).

One run measures all three setups at concurrency 1 and 16 against the same demo upstream, each
in its own process (upstream, sidecar, Envoy, and this load generator), and writes
bench/results/gateway.md (+ .json) with the command and the machine.

    nice -n 15 .venv/bin/python -m bench.gateway_bench --requests 400

"Added latency" is each setup's latency minus bare Envoy's at the same concurrency. The
TruthLens target: pass-through p50 within 1.2x of the do-nothing processor's
latency and at least 0.8x its throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from urllib.parse import urlsplit

from bench.common import REPO, command, machine, percentile, write_results
from extproc.devtools.processes import EnvoyProcess, free_port, terminate, wait_grpc_serving

PROMPT = {"model": "truthlens-demo", "messages": [{"role": "user", "content": "Write a short poem about the sea."}]}


class Sample:
    """Latencies and busy time of one setup at one concurrency, accumulated over rounds."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.latencies: list[float] = []
        self.elapsed = 0.0
        self.cpu_s = 0.0  # the setup's sidecar process CPU time (user + system) while measured
        self.statuses: dict[str, int] = {}
        self.rounds: list[tuple[float, float]] = []  # (p50 ms, req/s) of each round, for paired ratios

    def add_round(self, other: Sample) -> None:
        self.rounds.append((statistics.median(other.latencies), len(other.latencies) / other.elapsed))
        self.latencies += other.latencies
        self.elapsed += other.elapsed
        for k, v in other.statuses.items():
            self.statuses[k] = self.statuses.get(k, 0) + v

    def summary(self) -> dict[str, Any]:
        lat = self.latencies
        return {
            "concurrency": self.concurrency,
            "requests": len(lat),
            "p50_ms": statistics.median(lat),
            "p99_ms": percentile(lat, 0.99),
            "mean_ms": statistics.fmean(lat),
            "rps": len(lat) / self.elapsed,
            "sidecar_cpu_ms_per_request": self.cpu_s * 1000 / len(lat) if lat else 0.0,
            "verdict_statuses": self.statuses,
            "round_p50_ms": [p for p, _ in self.rounds],
            "round_rps": [r for _, r in self.rounds],
        }


class Connection:
    """A minimal keep-alive HTTP/1.1 client for one fixed POST: httpx costs more CPU per request
    than the gateway under test, and on 2 cores the load generator's cost is everyone's latency."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        body = json.dumps(PROMPT).encode()  # PROMPT may be replaced by --prompt before any connection
        self.request = (f"POST {u.path} HTTP/1.1\r\nhost: {u.netloc}\r\ncontent-type: application/json\r\n"
                        f"content-length: {len(body)}\r\n\r\n").encode() + body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self) -> tuple[int, str]:
        """(status, x-truthlens-status or '-'); the body is read and dropped."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, verdict = 0, "-"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "x-truthlens-status":
                verdict = value.strip()
            elif name == "transfer-encoding":
                raise RuntimeError("chunked responses are not expected in this benchmark")
        await self.reader.readexactly(length)
        return status, verdict

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def burst(conns: list[Connection], sample: Sample, requests: int) -> None:
    """`requests` requests from one worker per connection; adds to the sample."""
    remaining = requests

    async def worker(conn: Connection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            status, verdict = await conn.post()
            sample.latencies.append((time.perf_counter() - t0) * 1000)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
            sample.statuses[verdict] = sample.statuses.get(verdict, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    sample.elapsed += time.perf_counter() - t0


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds of a process (its live threads); 0 when there is none (bare Envoy). Linux's per-thread
    schedstat counts nanoseconds; psutil's user + system count clock ticks (10 ms), which a few dozen requests
    to a do-nothing processor (~1 ms of CPU) can miss entirely, so it is the fallback."""
    if pid is None:
        return 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # not Linux
        import psutil

        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    ns = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                ns += int(fh.read().split()[0])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return ns / 1e9


async def measure(urls: dict[str, str], concurrency: int, requests: int, rounds: int, warmup: int,
                  pids: dict[str, int | None] | None = None) -> dict[str, Any]:
    """Interleave the setups in `rounds` so load drift on a shared machine hits all of them alike.

    The order rotates every round: each setup runs as often first as last, so whatever the
    previous setup leaves behind (caches, CPU frequency, scheduler state) is spread evenly.
    """
    samples = {label: Sample(concurrency) for label in urls}
    conns = {label: [Connection(url) for _ in range(concurrency)] for label, url in urls.items()}
    labels = list(urls)
    try:
        for label in labels:
            await burst(conns[label], Sample(concurrency), warmup)
        per_round = max(1, requests // rounds)
        for r in range(rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                pid = (pids or {}).get(label)
                cpu0 = process_cpu_s(pid)
                this_round = Sample(concurrency)
                await burst(conns[label], this_round, per_round)
                samples[label].cpu_s += process_cpu_s(pid) - cpu0
                samples[label].add_round(this_round)
    finally:
        for cs in conns.values():
            for c in cs:
                await c.close()
    return {label: s.summary() for label, s in samples.items()}


def wait_port(port: int, timeout: float) -> bool:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def start_sidecar(kind: str, config: str | None) -> tuple[subprocess.Popen[bytes] | None, str]:
    if kind == "bare":
        return None, ""
    address = f"127.0.0.1:{free_port()}"
    if kind == "noop":
        cmd = [sys.executable, "-m", "bench.noop_processor", "--address", address]
    else:
        # As deployed: Prometheus metrics on (every verdict is recorded), logs at warning.
        cmd = [sys.executable, "-m", "extproc.commands.serve", "--grpc-address", address,
               "--metrics-address", f"127.0.0.1:{free_port()}", "--log-level", "warning"]
        if config:
            cmd += ["--config", config]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
    if not wait_grpc_serving(address, 180, proc):
        raise RuntimeError(f"{kind} sidecar did not start")
    return proc, address


TRUTHLENS = "Envoy + TruthLens (non-factual prompt)"
TRUTHLENS_GROUNDED = "Envoy + TruthLens (grounded check)"  # with --context


def setup_list(grounded: bool) -> tuple[tuple[str, str], ...]:
    return (("bare", "bare Envoy"), ("noop", "Envoy + do-nothing ext_proc"),
            ("truthlens", TRUTHLENS_GROUNDED if grounded else TRUTHLENS))


def run(args: argparse.Namespace) -> dict[str, Any]:
    upstream_port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    envoys: list[EnvoyProcess] = []
    upstream = subprocess.Popen([sys.executable, "-m", "bench.fast_upstream", "--port", str(upstream_port),
                                 "--delay-ms", str(args.upstream_delay_ms)], cwd=REPO, stdout=subprocess.DEVNULL)
    procs.append(upstream)
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    results: dict[str, Any] = {"machine": machine(), "command": command("bench.gateway_bench"), "setups": {},
                               "upstream_delay_ms": args.upstream_delay_ms, "prompt": PROMPT["messages"][0]["content"],
                               "context": PROMPT.get("truthlens_context")}
    try:
        if not wait_port(upstream_port, 30):
            raise RuntimeError("demo upstream did not start")
        urls = {"direct upstream": upstream_url + "/v1/chat/completions"}
        pids: dict[str, int | None] = {}
        for kind, label in setup_list(PROMPT.get("truthlens_context") is not None):
            proc, address = start_sidecar(kind, args.config)
            if proc is not None:
                procs.append(proc)
            pids[label] = proc.pid if proc is not None else None
            envoy = EnvoyProcess(address or "127.0.0.1:1", upstream_url, with_ext_proc=kind != "bare",
                                 concurrency=args.envoy_concurrency).start()
            envoys.append(envoy)
            urls[label] = envoy.base_url + "/v1/chat/completions"
        for c in args.concurrency:
            for label, r in asyncio.run(measure(urls, c, args.requests, args.rounds, args.warmup, pids)).items():
                results["setups"].setdefault(label, []).append(r)
                print(f"{label:40s} c={c:<3d} p50={r['p50_ms']:.2f}ms p99={r['p99_ms']:.2f}ms "
                      f"{r['rps']:.0f} req/s sidecar {r['sidecar_cpu_ms_per_request']:.3f} cpu-ms/req "
                      f"{r['verdict_statuses']}", flush=True)
    finally:
        for envoy in envoys:
            envoy.stop()
        for proc in reversed(procs):
            terminate(proc)
    return results


def report(results: dict[str, Any]) -> str:
    setups = results["setups"]
    bare = {r["concurrency"]: r for r in setups["bare Envoy"]}
    noop = {r["concurrency"]: r for r in setups["Envoy + do-nothing ext_proc"]}
    tl = {r["concurrency"]: r for r in setups[TRUTHLENS_GROUNDED if results.get("context") else TRUTHLENS]}
    lines = [
        "# Gateway overhead benchmark",
        "",
        f"Command: `{results['command']}` (from the repository root)",
        "",
        f"Machine: {results['machine']}. Every component is its own process on loopback: upstream",
        "(bench/fast_upstream.py, asyncio, fixed JSON answer), sidecars, Envoys 1.40, and the httpx load",
        "generator (raw asyncio keep-alive connections, one per concurrent worker); all share the 2 cores.",
        "All setups run side by side and are measured in interleaved rounds, so load from other tenants",
        "of this shared machine hits each setup alike.",
        "",
        f"Prompt: `{results.get('prompt', PROMPT['messages'][0]['content'])}`"
        f"{' with a grounding passage (truthlens_context)' if results.get('context') else ''}, JSON response;",
        f"the upstream answers after {results['upstream_delay_ms']:g} ms (a stand-in for LLM generation time).",
        "Added = latency minus bare Envoy's at the same concurrency (what the ext_proc filter costs).",
        "Direct upstream (no Envoy) is shown for reference only.",
        "",
        "Sidecar CPU = the ext_proc process's user + system CPU time per request while measured.",
        "",
        "| setup | concurrency | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | sidecar CPU ms/req | x-truthlens-status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, rows in setups.items():
        for r in rows:
            d = bare[r["concurrency"]]
            lines.append(
                f"| {label} | {r['concurrency']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['p50_ms'] - d['p50_ms']:.2f} | {r['p99_ms'] - d['p99_ms']:.2f} | {r['rps']:.0f} | "
                f"{r.get('sidecar_cpu_ms_per_request', 0.0):.3f} | "
                f"{', '.join(f'{k}: {v}' for k, v in r['verdict_statuses'].items())} |"
            )
    lines += ["", "## Target: TruthLens vs the do-nothing processor", "",
              "Pooled: all rounds' requests together. Paired: the ratio within each round (the two setups",
              "measured seconds apart, so slow drift in load from other tenants cancels), median over the",
              "rounds with the middle half of the rounds in brackets: the spread shows how noisy the machine was.",
              "",
              "| concurrency | latency ratio p50, pooled (target <= 1.2) | paired | latency ratio p99, pooled "
              "| throughput ratio, pooled (target >= 0.8) | paired |",
              "|---:|---:|---:|---:|---:|---:|"]
    for c in sorted(tl):
        lat = paired(tl[c].get("round_p50_ms"), noop[c].get("round_p50_ms"))
        thr = paired(tl[c].get("round_rps"), noop[c].get("round_rps"))
        lines.append(f"| {c} | {tl[c]['p50_ms'] / noop[c]['p50_ms']:.2f} | {lat} | {tl[c]['p99_ms'] / noop[c]['p99_ms']:.2f} "
                     f"| {tl[c]['rps'] / noop[c]['rps']:.2f} | {thr} |")
    if results.get("notes"):
        lines += ["", "## Notes", "", *[f"* {n}" for n in results["notes"]]]
    return "\n".join(lines) + "\n"


def paired(ours: list[float] | None, base: list[float] | None) -> str:
    """Median [quartiles] of the per-round ratios ours/base; '-' for results without rounds."""
    if not ours or not base or len(ours) != len(base):
        return "-"
    ratios = sorted(a / b for a, b in zip(ours, base))
    q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return f"{med:.2f} [{q1:.2f}–{q3:.2f}]"


def auto_notes(args: argparse.Namespace) -> list[str]:
    """What this run's TruthLens did with the prompt, so the report explains its own numbers."""
    notes = ["TruthLens runs as deployed: `truthlens serve` with Prometheus metrics on, logs at warning, "
             "onnxruntime spinning off."]
    if args.no_models:
        return [*notes, "No models configured: the prompt ends `unverified` (no sentinel), so this is the "
                        "gateway's own cost (parsing, policy, verdict headers, metrics)."]
    if args.context is not None:
        notes.append(f"Every request carries a {len(args.context)}-character `truthlens_context`: the prompt is "
                     "checked against it (the upstream's fixed answer) without asking the sentinel "
                     "(`truthlens.grounding.check_when_grounded`).")
    if args.config:
        return [*notes, f"Config: `{args.config}`."]
    if args.context is not None:
        return notes
    from extproc.inference.prefilter import LexicalPrefilter

    decided, p = LexicalPrefilter.load(REPO / "models" / "sentinel").decide(args.prompt)
    if decided is None:
        notes.append(f"Bundled models. The sentinel's lexical prefilter is unsure of this prompt (P(factual) "
                     f"{p:.4f}), so the MiniLM sentinel encoder runs on every request, while the request is upstream.")
    else:
        notes.append(f"Bundled models. The sentinel's lexical prefilter decides this prompt (P(factual) {p:.4f}) "
                     "without the encoder, inline in a few microseconds.")
    if args.context is None:
        notes.append("Verdict `skipped` (non-factual): three messages per request (the response body never goes to "
                     "the sidecar, which ends the gRPC stream itself after the response headers); the do-nothing "
                     "processor gets four.")
    return notes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400, help="measured requests per setup and concurrency")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--rounds", type=int, default=16, help="interleaved rounds (setups alternate each round)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--config", default=None, help="TruthLens config (default: built-in defaults, bundled models)")
    p.add_argument("--no-models", action="store_true",
                   help="run TruthLens with no models (no sentinel: the prompt ends unverified, not skipped)")
    p.add_argument("--upstream-delay-ms", type=float, default=0.0,
                   help="upstream answer delay (LLM generation stand-in); 0 = pure gateway overhead")
    p.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    p.add_argument("--prompt", default=PROMPT["messages"][0]["content"],
                   help="the user message every request sends (default: a poem request)")
    p.add_argument("--context", default=None,
                   help="grounding passage sent as truthlens_context: every prompt is then checked (detector, "
                        "verifier and, per the config, the surrogate's signals) against the upstream's fixed answer")
    p.add_argument("--note", action="append", default=[], help="a line for the report's Notes section")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "gateway.md"))
    args = p.parse_args()
    PROMPT["messages"][0]["content"] = args.prompt
    if args.context is not None:
        PROMPT["truthlens_context"] = args.context
    if args.no_models:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115
        tmp.write("truthlens:\n  models: {sentinel: null, detector: null, explainer: null}\n")
        tmp.close()
        args.config = tmp.name
    results = run(args)
    results["notes"] = [*auto_notes(args), *args.note]
    out = write_results(args.out, report(results), results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
