"""Markdown for `python -m bench.inference_bench` results (the JSON next to it is the record)."""

from __future__ import annotations

from typing import Any

TARGET_WINDOW_MS = 25.0
TARGET_RSS_MIB = 1024.0
PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def _f(x: float) -> str:
    return f"{x:.1f}"


def gpu_line(r: dict[str, Any]) -> str:
    """Which GPU the numbers come from, or how to take GPU numbers."""
    if r.get("provider") == "cuda":
        return f"- GPU: {r['machine']['gpu']} (onnxruntime CUDA provider)"
    return ("- GPU: not used; for GPU numbers rerun the same command with `--provider cuda` on a GPU host with "
            "onnxruntime-gpu (`bench/results/inference-cuda-float.md` has one, on an H200).")


def _header(r: dict[str, Any]) -> list[str]:
    m = r["machine"]
    return [
        "# Inference benchmark" + (" (QUICK: harness check, numbers not meaningful)" if r["quick"] else ""),
        "",
        f"- Command: `{r['command']}`",
        f"- Date: {r['date_utc']}, commit {m['git_commit']}, wall {r['wall_s']} s",
        f"- Machine: {m['cpu']}, {m['cores']} cores, SIMD {'/'.join(m.get('simd') or ['?'])} (load average "
        f"{m['loadavg_start'][0]:.1f} at start, {m['loadavg_end'][0]:.1f} at end: above the core count means "
        f"other jobs shared the CPU); onnxruntime {m['onnxruntime']} "
        f"{PROVIDER_NAMES[r.get('provider', 'cpu')]}, intra-op threads {r['threads']}",
        "- Models: " + "; ".join(f"{role} `{i['path']}` ({i['name']}, max_length {i['max_length']}, "
                                 f"{i['onnx_mb']} MB)" for role, i in r["models"].items()),
        gpu_line(r),
        "- `cpu ms` = process CPU time per call (all threads). On a shared machine wall time also measures "
        "the other jobs and CPU time is the steadier number; with 2 idle cores, wall is roughly cpu / 2.",
        "",
    ]


def _detector(det: dict[str, Any]) -> list[str]:
    lines = [
        "## Detector latency vs context length (windowing included)",
        "",
        f"Synthetic context of exactly N detector tokens, question + {det['answer_tokens']}-token answer, "
        "`Detector.predict` (tokenize, window, one batched forward pass over all windows, max over windows).",
        "",
        "| context tokens | windows | row tokens | p50 ms | p95 ms | cpu ms p50 | n |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in det["lengths"]:
        lines.append(f"| {x['context_tokens']} | {x['windows']} | {x['row_tokens']} | {_f(x['p50'])} | "
                     f"{_f(x['p95'])} | {_f(x['cpu_p50'])} | {x['n']} |")
    fw = det["full_window"]
    e2e, sess = fw["end_to_end_ms"], fw["session_only_ms"]
    verdict = "meets" if e2e["p50"] <= TARGET_WINDOW_MS else "misses"
    lines += [
        "",
        f"**One full window** ({fw['row_tokens']} of max_length {fw['max_length']} tokens, "
        f"{fw['context_tokens']} context tokens): end to end p50 {_f(e2e['p50'])} ms / p95 {_f(e2e['p95'])} ms "
        f"(cpu {_f(e2e['cpu_p50'])} ms); ONNX session only p50 {_f(sess['p50'])} ms (cpu {_f(sess['cpu_p50'])} ms). "
        f"Target <= {TARGET_WINDOW_MS:.0f} ms p50 on 2 cores: **{verdict}**.",
        "",
    ]
    if det.get("row_sizes"):
        lines += ["ONNX session time for one row by row length (what a window size costs on this CPU):", "",
                  "| row tokens | threads | p50 ms | p95 ms | cpu ms p50 |", "| ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {x['row_tokens']} | {x['threads']} | {_f(x['p50'])} | {_f(x['p95'])} | {_f(x['cpu_p50'])} |"
                  for x in det["row_sizes"]]
        lines.append("")
    return lines


def _explainer(ex: dict[str, Any]) -> list[str]:
    lines = ["## Explainer (NLI) cost per span", "",
             f"Premise {ex['premise_tokens']} tokens; {ex['hypothesis']}; one batched `Explainer.predict_batch`.", "",
             "| spans | rows | p50 ms | p95 ms | cpu ms p50 | ms/span (p50) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for x in ex["runs"]:
        lines.append(f"| {x['spans']} | {x['rows']} | {_f(x['p50'])} | {_f(x['p95'])} | {_f(x['cpu_p50'])} | "
                     f"{_f(x['ms_per_span_p50'])} |")
    return lines + [""]


def _throughput(tp: dict[str, Any]) -> list[str]:
    windows = next(iter(tp["modes"].values()))["windows_per_request"]
    lines = ["## Engine throughput (`OnnxEngine.detect`, asyncio clients)", "",
             f"Context {tp['context_tokens']} tokens + question + answer ({windows} window(s) per request), "
             f"explainer {tp['explainer']}. Batching on = default `max_wait_ms`; off = `max_wait_ms: 0` and "
             "`max_batch_tokens: 1` (one row per forward pass).", "",
             "| mode | concurrency | requests | req/s | p50 ms | p95 ms | cpu ms/request |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode, d in tp["modes"].items():
        for x in d["runs"]:
            lines.append(f"| {mode} | {x['concurrency']} | {x['requests']} | {_f(x['rps'])} | {_f(x['p50'])} | "
                         f"{_f(x['p95'])} | {_f(x['cpu_ms_per_request'])} |")
    return lines + [""]


def _rss(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["## Sidecar memory (VmRSS of a fresh process, MiB)", "",
             "`build_engine` with " + ", ".join(runs[0]["roles"]) + ". Typical = one sentinel call, one detect on a "
             "256-token context, one 4-hypothesis NLI call. Worst case = then one detect on a 16K-token context and a "
             "16-hypothesis NLI call on a 1K-token premise (full `max_batch_tokens` batches of max_length rows; "
             "onnxruntime's arena keeps that memory).", "",
             "| max_batch_tokens | imports only | models loaded | after typical | after worst case | peak (VmHWM) | "
             f"<= {TARGET_RSS_MIB:.0f} MiB |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for x in runs:
        m = x["mib"]
        ok = "yes" if m["peak"] <= TARGET_RSS_MIB else "no"
        lines.append(f"| {x['max_batch_tokens']} | {m['baseline']} | {m['loaded']} | {m['typical']} | "
                     f"{m['worst_case']} | {m['peak']} | {ok} |")
    if len(runs[0]["roles"]) < 3:
        lines.append(f"\nOnly {len(runs[0]['roles'])} of the three models were available.")
    return lines + [""]


def write_markdown(r: dict[str, Any]) -> str:
    lines = _header(r) + _detector(r["detector"])
    if "explainer" in r:
        lines += _explainer(r["explainer"])
    lines += _throughput(r["throughput"]) + _rss(r["rss"])
    if r.get("notes"):
        lines += ["## Notes", "", *(f"- {n}" for n in r["notes"]), ""]
    return "\n".join(lines)
