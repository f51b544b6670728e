"""What judging a stream costs the client: time to first byte and delay per token, through real Envoy.

A scripted upstream streams an answer one word per chunk at a fixed pace (an LLM at ~50 tokens/s by
default); the same requests go through bare Envoy (no ext_proc), and through Envoy + the real
`truthlens serve` (bundled models) with `stream.hold_back: none` and `sentence`. Per request:
time to the first byte, the delay of each content event against bare Envoy's arrival of the same
event, and the time from the last content event to the verdict event. Writes
bench/results/streaming.md (+ .json).

    nice -n 10 .venv/bin/python -m bench.streaming_bench --requests 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import REPO, command, machine, percentile, write_results
from extproc.devtools.demo_upstream import Script, completion_sse_chunks, start_demo_upstream
from extproc.devtools.processes import EnvoyProcess, free_port, terminate, wait_grpc_serving

ANSWER = ("The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall. "
          "It was the tallest structure in the world until 1930. About seven million people visit it each year. "
          "It was first described in 1887 by a research team in Oslo, Norway.")
CONTEXT = ("The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall and was the tallest "
           "man-made structure in the world until the Chrysler Building was finished in 1930. It has about seven "
           "million visitors a year.")


def run_one(base_url: str, headers: dict[str, str]) -> dict[str, Any]:
    """One streamed request: arrival time (s, from sending) of the first byte and of each SSE event."""
    req = {"model": "m", "stream": True, "truthlens_context": [CONTEXT],
           "messages": [{"role": "user", "content": "Tell me about the Eiffel Tower."}]}
    t0 = time.perf_counter()
    first: float | None = None
    events: list[tuple[float, bytes]] = []
    buf = b""
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=req, headers=headers, timeout=120) as r:
        for part in r.iter_raw():
            now = time.perf_counter() - t0
            first = now if first is None else first
            buf += part
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                events.append((now, block))
    return {"status": r.status_code, "ttfb": first, "events": events}


def summarize(runs: list[dict[str, Any]], base: list[dict[str, Any]] | None) -> dict[str, Any]:
    """TTFB, per-event delay against the baseline's same event, and the wait for the verdict event."""
    ttfb = [r["ttfb"] * 1000 for r in runs]
    delays: list[float] = []
    verdict_wait: list[float] = []
    for i, r in enumerate(runs):
        content = [t for t, b in r["events"] if b'"content"' in b]
        verdict = [t for t, b in r["events"] if b'"truthlens"' in b]
        if verdict and content:
            verdict_wait.append((verdict[0] - content[-1]) * 1000)
        if base is not None:
            ref = [t for t, b in base[i % len(base)]["events"] if b'"content"' in b]
            delays += [(a - b) * 1000 for a, b in zip(content, ref)]
    out = {"requests": len(runs), "statuses": sorted({r["status"] for r in runs}),
           "ttfb_p50_ms": statistics.median(ttfb), "ttfb_p95_ms": percentile(ttfb, 0.95)}
    if delays:
        out |= {"event_delay_p50_ms": statistics.median(delays), "event_delay_p95_ms": percentile(delays, 0.95),
                "event_delay_max_ms": max(delays)}
    if verdict_wait:
        out |= {"verdict_after_last_token_p50_ms": statistics.median(verdict_wait),
                "verdict_after_last_token_p95_ms": percentile(verdict_wait, 0.95)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20, help="streamed requests per setup")
    p.add_argument("--token-ms", type=float, default=20.0, help="upstream pace: ms between one-word chunks")
    p.add_argument("--models", default=str(REPO / "models"), help="bundled model directories")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "streaming.md"))
    args = p.parse_args(argv)

    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=1)
    upstream = start_demo_upstream(scripts={"s": Script(content_type="text/event-stream", chunks=chunks,
                                                        delay_s=args.token_ms / 1000.0)})
    models = Path(args.models)
    cfg = {"truthlens": {"models": {r: str(models / r) for r in ("sentinel", "detector", "explainer", "surrogate")},
                         "inference_timeout_ms": 20000},
           "decisions": [{"name": "hold", "priority": 1,
                          "rules": {"conditions": [{"type": "header", "name": "x-hold"}]},
                          "plugins": {"truthlens": {"hold_back": "sentence"}}}]}
    workdir = tempfile.TemporaryDirectory(prefix="truthlens-stream-bench-")
    cfg_path = Path(workdir.name) / "tl.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    address = f"127.0.0.1:{free_port()}"
    sidecar = subprocess.Popen([sys.executable, "-m", "extproc.commands.serve", "--config", str(cfg_path),
                                "--grpc-address", address, "--no-metrics"], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bare = judged = None
    try:
        if not wait_grpc_serving(address, 300, sidecar):
            raise RuntimeError("truthlens serve did not start")
        bare = EnvoyProcess(address, upstream.url, with_ext_proc=False).start()
        judged = EnvoyProcess(address, upstream.url, message_timeout_s=30).start()
        script = {"x-demo-script": "s"}
        setups = {"bare Envoy": (bare, script), "hold_back none": (judged, script),
                  "hold_back sentence": (judged, {**script, "x-hold": "1"})}
        for envoy, headers in setups.values():  # warm-up: model sessions, connections
            run_one(envoy.base_url, headers)
        raw = {name: [run_one(e.base_url, h) for _ in range(args.requests)] for name, (e, h) in setups.items()}
    finally:
        for e in (bare, judged):
            if e is not None:
                e.stop()
        terminate(sidecar)
        upstream.stop()
        workdir.cleanup()
    results = {name: summarize(runs, None if name == "bare Envoy" else raw["bare Envoy"]) for name, runs in raw.items()}
    rows = []
    for name, s in results.items():
        rows.append(f"| {name} | {s['ttfb_p50_ms']:.1f} / {s['ttfb_p95_ms']:.1f} | "
                    + (f"{s['event_delay_p50_ms']:.1f} / {s['event_delay_p95_ms']:.1f} / {s['event_delay_max_ms']:.0f}"
                       if "event_delay_p50_ms" in s else "—")
                    + " | " + (f"{s['verdict_after_last_token_p50_ms']:.0f} / {s['verdict_after_last_token_p95_ms']:.0f}"
                               if "verdict_after_last_token_p50_ms" in s else "—") + " |")
    words = len(ANSWER.split())
    md = "\n".join([
        "# Streaming: what judging a stream costs the client", "",
        f"Command: `{command('bench.streaming_bench', argv)}`  ", f"Machine: {machine()}", "",
        f"A scripted upstream streams a {words}-word, 5-sentence answer (the last sentence unsupported) one word per "
        f"chunk every {args.token_ms:g} ms, through real Envoy: bare (no ext_proc), and with the real `truthlens "
        f"serve` (bundled models; streams are scored per sentence by detector + verifier) in STREAMED mode. "
        f"{args.requests} requests per setup, one at a time. *Event delay*: when each content event reached the "
        "client minus when the same event reached it through bare Envoy (same request index).", "",
        "| setup | TTFB p50 / p95 (ms) | event delay p50 / p95 / max (ms) | verdict after last token p50 / p95 (ms) |",
        "| --- | --- | --- | --- |", *rows, "",
        "With `hold_back: none` every chunk goes on as it arrives and the verdict waits only for the last "
        "sentence's check. With `sentence` a word is released once its sentence is checked: the delay grows "
        "with the sentence's length (its words wait for its end) plus one check.", ""])
    write_results(args.out, md, {"command": command("bench.streaming_bench", argv), "machine": machine(),
                                 "token_ms": args.token_ms, "requests": args.requests, "results": results})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
