"""Surrogate LM cost per signal for a 512-token context + 128-token answer (p50/p95), fp32 vs int8.

    .venv/bin/python -m bench.surrogate_bench            # models/surrogate (built by make setup-dev)
    .venv/bin/python -m bench.surrogate_bench --model data-cache/suite-gemma3/surrogate-gemma3 --fp32-only \
        --out bench/results/surrogate-gemma3              # another export (#16: Gemma 3 270M), fp32 only

Writes `<out>.json` and `<out>.md` (default bench/results/surrogate) with the command, machine and
date. Also measures what int8 dynamic quantization costs in agreement: the per-answer context PMI
of the int8 graph against fp32 on the same inputs (the signal the fused score reads).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import REPO as ROOT
from bench.common import RESULTS, command, cpu_name, write_results
from extproc.inference.gguf_export import default_gguf, export_gguf
from extproc.inference.runtime import RuntimeOptions
from extproc.inference.surrogate import SurrogateLM

WORDS = ("the committee said that the bridge opened in march after two years of work and that traffic on the old "
         "road fell by a third while the city council approved a budget for new bus lanes near the harbour").split()


def text_of(lm: SurrogateLM, tokens: int, seed: int) -> str:
    """Synthetic text cut to exactly `tokens` surrogate tokens."""
    rng = np.random.default_rng(seed)
    words = " ".join(rng.choice(WORDS, size=tokens * 2))
    ids = lm.tokenizer.encode(words, add_special_tokens=False).ids[:tokens]
    return lm.tokenizer.decode(ids)


# what each signal asks of `SurrogateLM.read` (context_pmi alone: the two passes every signal shares)
SIGNALS = {
    "context_pmi": {},
    "+ lens_emergence": {"lens": True},
    "+ latent_audit (hidden states)": {"hidden": True},
    "+ context_mmd (third pass)": {"other": True},
    "all four": {"lens": True, "hidden": True, "other": True},
}


def measure(lm: SurrogateLM, context_tokens: int, answer_tokens: int, runs: int, lens: bool = False,
            hidden: bool = False, other: bool = False) -> dict[str, float]:
    times = []
    for i in range(runs + 2):
        ctx, ans = text_of(lm, context_tokens, i), text_of(lm, answer_tokens, 1000 + i)
        other_ctx = [text_of(lm, context_tokens, 500 + i)] if other else None
        t0 = time.perf_counter()
        lm.read([ctx], "What did the committee say?", ans, hidden=hidden, lens=lens, other_context=other_ctx)
        if i >= 2:  # two warm-up runs
            times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95)), "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "surrogate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--provider", choices=("cpu", "cuda"), default="cpu",
                    help="onnxruntime provider (cuda: a GPU host with onnxruntime-gpu; it fails when CUDA does not run)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS / "surrogate")
    ap.add_argument("--fp32-only", action="store_true",
                    help="skip the int8 graph (its export and the agreement check): the model directory alone")
    args = ap.parse_args()
    opts = RuntimeOptions(args.provider, args.threads)
    fp32 = SurrogateLM(args.model, opts)
    shapes = [(512, 128), (256, 64), (1024 - 128 - 64, 128)]
    with tempfile.TemporaryDirectory() as tmp:
        lms = [("fp32", fp32)]
        if not args.fp32_only:
            export_gguf(default_gguf(), tmp, name="int8", hidden_layers=fp32.manifest.hidden_layers,
                        top_k=fp32.manifest.top_k, quantize="int8")
            lms.append(("int8", SurrogateLM(tmp, opts)))
        rows = {name: {f"{c}+{a}": measure(lm, c, a, args.runs) for c, a in shapes} for name, lm in lms}
        per_signal = {name: measure(fp32, 512, 128, args.runs, **kw) for name, kw in SIGNALS.items()}
        diffs = []
        for i in range(0 if args.fp32_only else 20):
            int8 = lms[1][1]
            ctx, ans = text_of(fp32, 512, 50 + i), text_of(fp32, 128, 80 + i)
            diffs.append(abs(fp32.context_pmi([ctx], None, ans).mean - int8.context_pmi([ctx], None, ans).mean))
        int8_mb = None if args.fp32_only else (Path(tmp) / "model.onnx").stat().st_size / 1e6
    general = fp32.manifest.provenance.get("general_name") or fp32.manifest.provenance.get("gguf")
    result = {
        "command": command("bench.surrogate_bench"),
        "machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "threads": args.threads,
                    "load_average_1m": round(os.getloadavg()[0], 2), "provider": fp32.provider},
        "date": dt.date.today().isoformat(),
        "model": fp32.name, "gguf": general, "fp32_mb": (args.model / "model.onnx").stat().st_size / 1e6,
        "int8_mb": int8_mb, "latency": rows, "per_signal_512_128_fp32": per_signal,
        "int8_vs_fp32_mean_pmi_abs_diff": {"mean": float(np.mean(diffs)), "max": float(np.max(diffs)), "answers": 20}
        if diffs else None,
    }
    sizes = f"fp32 {result['fp32_mb']:.0f} MB" + ("" if int8_mb is None else f", int8 {int8_mb:.0f} MB")
    lines = [
        "# Surrogate LM cost (context PMI: two forward passes per answer)", "",
        f"Command: `{result['command']}`  ", f"Machine: {result['machine']}  ", f"Date: {result['date']}", "",
        f"Model `{result['model']}` ({general}): {sizes}.", "",
        "Per signal (fp32, 512-token context + 128-token answer; each row adds to context PMI's two passes):", "",
        "| signals | p50 ms | p95 ms |", "| --- | --- | --- |",
        *[f"| {k} | {v['p50_ms']:.0f} | {v['p95_ms']:.0f} |" for k, v in per_signal.items()], "",
        "Context PMI alone" + ("" if args.fp32_only else ", fp32 vs int8") + ":", "",
        "| graph | context + answer tokens | p50 ms | p95 ms |", "| --- | --- | --- | --- |",
        *[f"| {g} | {k} | {v['p50_ms']:.0f} | {v['p95_ms']:.0f} |" for g, by in rows.items() for k, v in by.items()], "",
    ]
    if diffs:
        agreement = result["int8_vs_fp32_mean_pmi_abs_diff"]
        lines += [f"int8 vs fp32, |mean context PMI| difference over 20 answers (512 + 128 tokens): mean "
                  f"{agreement['mean']:.3f} nats, max {agreement['max']:.3f}. "
                  "The shipped graph is fp32: the stacked calibration was fitted on fp32 PMI.", ""]
    write_results(args.out.with_suffix(".md"), "\n".join(lines), result)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
