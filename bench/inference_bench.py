"""Inference benchmark: detector latency vs context length, explainer cost per span,
engine throughput at concurrency 1/8/32 with and without batching, sidecar RSS.

    nice -n 15 .venv/bin/python -m bench.inference_bench            # bundled models
    .venv/bin/python -m bench.inference_bench --quick --detector DIR --explainer DIR --sentinel DIR \
        --out /tmp/bench                                            # harness check on any model dirs

Writes `<out>.json` and `<out>.md` (default bench/results/inference) with the command, machine and date.
Contexts are synthetic text cut to an exact token count with the detector's own tokenizer, so
"4K tokens" means 4096 detector tokens of context, windowed exactly as in serving.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.common import REPO as ROOT
from bench.common import command, git_commit, write_results
from extproc.evaluation.machine import cpu_name, gpu, simd
from extproc.config import default_config
from extproc.inference.engine import EngineSettings, build_engine
from extproc.inference.models import Detector, Explainer, OnnxModel
from extproc.inference.runtime import RuntimeOptions
from extproc.inference.windowing import Row

VOCAB = (
    "the report says that revenue grew by seven percent in the third quarter while costs fell as the company "
    "moved production to a new plant near the river where water levels were low during a long dry summer and "
    "engineers tested pumps built in 1998 by a firm founded in paris whose capital came from investors in "
    "london berlin and tokyo who expected growth of about twelve percent per year over the next decade"
).split()
QUESTION = "How much did revenue grow in the third quarter and why?"
ANSWER = (
    "Revenue grew by nine percent in the third quarter because the company moved production to a new plant "
    "in Berlin, which cut costs sharply."
)


def synthetic_text(tokenizer: Any, n_tokens: int, seed: int = 0) -> str:
    """Text that encodes (no special tokens) to exactly n_tokens, cut at a token boundary."""
    if n_tokens <= 0:
        return ""
    rng = random.Random(seed)
    words = [rng.choice(VOCAB) for _ in range(n_tokens * 2 + 64)]
    text = " ".join(words)
    enc = tokenizer.encode(text, add_special_tokens=False)
    if len(enc.ids) < n_tokens:
        raise ValueError(f"synthetic text too short: {len(enc.ids)} < {n_tokens} tokens")
    cut = text[: enc.offsets[n_tokens - 1][1]]
    got = len(tokenizer.encode(cut, add_special_tokens=False).ids)
    while got > n_tokens:  # a cut inside a word can re-tokenize differently; back off
        cut = cut[:-1]
        got = len(tokenizer.encode(cut, add_special_tokens=False).ids)
    return cut


def stats(values_ms: list[float], cpu_ms: list[float] | None = None) -> dict[str, float]:
    v = np.asarray(values_ms, dtype=np.float64)
    out = {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)), "mean": float(v.mean()),
           "n": int(v.size)}
    if cpu_ms:
        out["cpu_p50"] = float(np.percentile(np.asarray(cpu_ms), 50))
    return out


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Wall and process CPU time per call. On a shared machine CPU time is the steadier number
    (it does not grow while other jobs hold the cores, though onnxruntime's spinning threads add some)."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    return stats(wall, cpu)


def bench_detector(model: OnnxModel, lengths: list[int], repeats: int) -> dict[str, Any]:
    det = Detector(model)
    tok = model.tokenizer
    rows_out = []
    for n in lengths:
        ctx = synthetic_text(tok, n, seed=n)
        prepared = det.prepare([ctx], QUESTION, ANSWER)
        reps = max(3, repeats * 512 // max(n, 512))
        ms = timed(lambda: det.predict([ctx], QUESTION, ANSWER), reps, warmup=1 if n > 1024 else 2)
        rows_out.append({"context_tokens": n, "windows": len(prepared.rows),
                         "row_tokens": sum(len(r) for r in prepared.rows), **ms})
        print(f"detector ctx={n:>6} windows={len(prepared.rows):>3} p50={rows_out[-1]['p50']:.1f} ms", file=sys.stderr)
    return {"answer_tokens": len(tok.encode(ANSWER, add_special_tokens=False).ids), "lengths": rows_out,
            "full_window": _full_window(det, repeats)}


def _full_window(det: Detector, repeats: int) -> dict[str, Any]:
    """The largest context that still fits one row: one full max_length window, end to end and session only."""
    tok, max_len = det.model.tokenizer, det.model.manifest.max_length
    lo, hi = 0, max_len
    while lo < hi:  # largest k with a single row
        mid = (lo + hi + 1) // 2
        if len(det.prepare([synthetic_text(tok, mid, 7)], QUESTION, ANSWER).rows) == 1:
            lo = mid
        else:
            hi = mid - 1
    ctx = synthetic_text(tok, lo, 7)
    row = det.prepare([ctx], QUESTION, ANSWER).rows[0]
    end_to_end = timed(lambda: det.predict([ctx], QUESTION, ANSWER), repeats)
    session = timed(lambda: det.model.infer([row]), repeats)
    return {"row_tokens": len(row), "max_length": max_len, "context_tokens": lo,
            "end_to_end_ms": end_to_end, "session_only_ms": session}


def bench_row_sizes(args: argparse.Namespace, det: Detector, repeats: int) -> list[dict[str, Any]]:
    """ONNX session time for one row of 128/256/512 tokens, with the bench's threads and with 1:
    which window size a latency target allows on this CPU."""
    full = det.prepare([synthetic_text(det.model.tokenizer, 4096, 7)], QUESTION, ANSWER).rows[0]
    single = OnnxModel(args.detector, "detector", RuntimeOptions(args.provider, 1, 1))
    out = []
    for n in (128, 256, 512):
        if n > len(full):
            break
        row = Row(tuple(full.input_ids[:n]), tuple(full.type_ids[:n]))
        out.append({"row_tokens": n, "threads": args.threads, **timed(lambda: det.model.infer([row]), repeats)})
        out.append({"row_tokens": n, "threads": 1, **timed(lambda: single.infer([row]), repeats)})
        print(f"session row={n} p50={out[-2]['p50']:.1f} ms ({args.threads} threads), "
              f"{out[-1]['p50']:.1f} ms (1 thread)", file=sys.stderr)
    return out


def bench_explainer(model: OnnxModel, span_counts: list[int], repeats: int) -> dict[str, Any]:
    exp = Explainer(model)
    premise = synthetic_text(model.tokenizer, 256, seed=3)
    rng = random.Random(5)
    out = []
    for k in span_counts:
        hyps = [" ".join(rng.choice(VOCAB) for _ in range(14)).capitalize() + f" in {1900 + i}." for i in range(k)]
        rows = sum(len(p.rows) for p in exp.prepare([premise], hyps))
        s = timed(lambda: exp.predict_batch([premise], hyps), max(3, repeats // 3), warmup=1)
        out.append({"spans": k, "rows": rows, **s, "ms_per_span_p50": s["p50"] / k})
        print(f"explainer spans={k:>3} p50={s['p50']:.1f} ms ({s['p50'] / k:.1f} ms/span)", file=sys.stderr)
    return {"premise_tokens": 256, "hypothesis": "one distinct sentence per span (no sentence sharing)", "runs": out}


async def _load(engine: Any, context: str, concurrency: int, total: int) -> dict[str, Any]:
    lat: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            await engine.detect([context], QUESTION, ANSWER)
            lat.append((time.perf_counter() - t0) * 1000.0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up: one round
    lat.clear()
    remaining = total
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"concurrency": concurrency, "requests": total, "rps": total / wall,
            "cpu_ms_per_request": cpu * 1000.0 / total, **stats(lat)}


def bench_throughput(args: argparse.Namespace, concurrencies: list[int]) -> dict[str, Any]:
    modes = {
        "batching on": {},  # the config's batching
        # max_batch_tokens=1: the batcher takes one job per forward pass and the model one row per run
        "batching off": {"max_wait_ms": 0.0, "max_batch_tokens": 1},
    }
    results = {}
    for name, overrides in modes.items():
        settings = EngineSettings.from_config(
            default_config(), sentinel_dir=None, detector_dir=args.detector, explainer_dir=None, surrogate_dir=None,
            explainer_enabled=False, provider=args.provider, intra_op_threads=args.threads, **overrides)
        engine = build_engine(settings)
        ctx = synthetic_text(engine.detector.model.tokenizer, args.throughput_context, seed=11)
        windows = len(engine.detector.prepare([ctx], QUESTION, ANSWER).rows)

        async def run_all() -> list[dict[str, Any]]:
            out = []
            for c in concurrencies:
                out.append(await _load(engine, ctx, c, max(args.min_requests, 4 * c)))
                print(f"throughput {name} c={c:>2} {out[-1]['rps']:.1f} req/s p50={out[-1]['p50']:.1f} ms",
                      file=sys.stderr)
            await engine.close()
            return out

        results[name] = {"settings": {k: getattr(settings, k) for k in ("max_wait_ms", "max_batch_tokens")},
                         "windows_per_request": windows,
                         "runs": asyncio.run(run_all())}
    return {"context_tokens": args.throughput_context, "explainer": "off (detector only)", "modes": results}


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def rss_child(args: argparse.Namespace) -> None:
    """Runs in a fresh process: RSS before models, loaded, after a typical request, after worst-case batches.

    onnxruntime's CPU arena keeps the largest batch it has seen, so the worst case
    (a full `max_batch_tokens` batch of max_length rows) is what the sidecar holds afterwards.
    """
    kb: dict[str, int] = {"baseline": _vm("VmRSS")}
    # the 16K-token request stands for concurrent requests whose rows the batcher packs into full batches:
    # one request alone may not exceed batching.max_request_tokens, several at once fill the same batches
    engine = build_engine(EngineSettings.from_config(
        default_config(), sentinel_dir=args.sentinel, detector_dir=args.detector, explainer_dir=args.explainer,
        surrogate_dir=None, provider=args.provider, intra_op_threads=args.threads, max_batch_tokens=args.rss_batch_tokens,
        max_request_tokens=4 * 16384))
    kb["loaded"] = _vm("VmRSS")
    tok = engine.detector.model.tokenizer

    async def calls() -> None:
        if engine.has("sentinel"):
            await engine.classify_prompt(QUESTION)
        ctx = synthetic_text(tok, 256, seed=1)
        await engine.detect([ctx], QUESTION, ANSWER)
        if engine.explainer is not None:  # detect() runs NLI only when spans are flagged: force one run
            engine.explainer.predict_batch([ctx], [ANSWER] * 4)
        kb["typical"] = _vm("VmRSS")
        big = synthetic_text(tok, 16384, seed=2)
        await engine.detect([big], QUESTION, ANSWER)
        if engine.explainer is not None:
            # 16 hypotheses x 3 premise windows = 48 max_length rows: at least one full batch
            engine.explainer.predict_batch([synthetic_text(tok, 1024, seed=3)], [ANSWER] * 16)
        kb["worst_case"] = _vm("VmRSS")
        await engine.close()

    asyncio.run(calls())
    kb["peak"] = _vm("VmHWM")
    print(json.dumps({"roles": [m.role for m in engine.models()], "max_batch_tokens": args.rss_batch_tokens,
                      "mib": {k: round(v / 1024, 1) for k, v in kb.items()}}))


def bench_rss(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for budget in [int(x) for x in args.rss_batch_budgets.split(",")]:
        cmd = [sys.executable, "-m", "bench.inference_bench", "--rss-child", "--detector", args.detector, "--explainer", args.explainer,
               "--sentinel", args.sentinel, "--threads", str(args.threads), "--provider", args.provider,
               "--rss-batch-tokens", str(budget)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"rss max_batch_tokens={budget}: {out[-1]['mib']}", file=sys.stderr)
    return out


def machine() -> dict[str, Any]:
    import onnxruntime as ort

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "simd": simd(), "gpu": gpu() or "none",
            "python": platform.python_version(), "onnxruntime": ort.__version__,
            "providers": ort.get_available_providers(), "os": platform.platform(), "loadavg_start": os.getloadavg(),
            "git_commit": git_commit()}


def model_info(path: str) -> dict[str, Any]:
    m = json.loads((Path(path) / "truthlens.json").read_text())
    size = (Path(path) / "model.onnx").stat().st_size
    return {"path": path, "name": m.get("name"), "max_length": m.get("max_length"), "onnx_mb": round(size / 2**20, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--detector", default="models/detector")
    p.add_argument("--explainer", default="models/explainer")
    p.add_argument("--sentinel", default="models/sentinel")
    p.add_argument("--lengths", default="256,512,1024,4096,16384", help="context lengths in detector tokens")
    p.add_argument("--spans", default="1,4,16", help="explainer span counts")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--repeats", type=int, default=20, help="timed calls at <= 512 tokens (fewer for longer)")
    p.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (2 = the target machine)")
    p.add_argument("--provider", choices=("cpu", "cuda"), default="cpu",
                   help="onnxruntime provider (cuda: a GPU host with onnxruntime-gpu; it fails when CUDA does not run)")
    p.add_argument("--throughput-context", type=int, default=256, help="context tokens per throughput request")
    p.add_argument("--min-requests", type=int, default=48)
    p.add_argument("--quick", action="store_true", help="few repeats: check the harness, not the numbers")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "inference"), help="output path without suffix")
    p.add_argument("--rss-batch-budgets", default="16384,4096",
                   help="max_batch_tokens values to measure RSS with (16384 = the config default)")
    p.add_argument("--note", action="append", default=[], help="a line for the Notes section (repeatable)")
    p.add_argument("--render", metavar="JSON", help="only re-render JSON's markdown, appending --note lines")
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rss-batch-tokens", type=int, default=16384, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.min_requests = 5, 8
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        rss_child(args)
        return 0
    from bench.inference_report import write_markdown

    if args.render:  # re-render the markdown from a saved JSON (e.g. after adding notes)
        result = json.loads(Path(args.render).read_text())
        result["notes"] = result.get("notes", []) + args.note
        Path(args.render).write_text(json.dumps(result, indent=2) + "\n")
        Path(args.render).with_suffix(".md").write_text(write_markdown(result))
        return 0
    lengths = [int(x) for x in args.lengths.split(",")]
    opts = RuntimeOptions(args.provider, args.threads, 1)
    started = dt.datetime.now(dt.timezone.utc)
    result: dict[str, Any] = {
        "command": command("bench.inference_bench", argv),
        "date_utc": started.strftime("%Y-%m-%d %H:%M UTC"), "quick": args.quick, "threads": args.threads,
        "provider": args.provider,
        "machine": machine(), "notes": list(args.note),
        "models": {r: model_info(getattr(args, r)) for r in ("detector", "explainer", "sentinel")
                   if Path(getattr(args, r), "truthlens.json").is_file()},
    }
    detector = OnnxModel(args.detector, "detector", opts)
    result["detector"] = bench_detector(detector, lengths, args.repeats)
    result["detector"]["row_sizes"] = bench_row_sizes(args, Detector(detector), args.repeats)
    if "explainer" in result["models"]:
        result["explainer"] = bench_explainer(OnnxModel(args.explainer, "explainer", opts),
                                              [int(x) for x in args.spans.split(",")], args.repeats)
    result["throughput"] = bench_throughput(args, [int(x) for x in args.concurrency.split(",")])
    result["rss"] = bench_rss(args)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["wall_s"] = round((dt.datetime.now(dt.timezone.utc) - started).total_seconds(), 1)
    out = write_results(Path(args.out).with_suffix(".md"), write_markdown(result), result)
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
