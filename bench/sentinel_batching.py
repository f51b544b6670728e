"""How much a sentinel probability depends on the other prompts in its batch.

The gateway batches sentinel rows across concurrent requests, and dynamic int8 quantization
scales activations over the whole batch, so batch-mates move a prompt's P(factual). This
measures it on held-out dev prompts through the serving `Sentinel`: each prompt beside one
other prompt (of the same token length, and of a longer one: padding), the same prompt
repeated, and random batches of 8 (decision flips at the recommended threshold). With
`--compare DIR` (any other sentinel directory, e.g. a weight-only MatMulNBits graph) the
same numbers and single-prompt latency are reported for it too.

    .venv/bin/python -m bench.sentinel_batching --prompts 400 --out bench/results/sentinel-batching.md
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, RESULTS, machine, write_results


def dev_prompts(n: int, seed: int) -> list[str]:
    from models import shared as common
    from models.pipelines.sentinel.data import build_splits

    if not (common.SHARED_DATA / "prompts").is_dir():
        raise SystemExit(f"error: {common.SHARED_DATA / 'prompts'} not found (set TRUTHLENS_DATA, or pass --prompts-file)")
    cfg = common.load_yaml(REPO / "models/sentinel/train.yaml")
    dev = build_splits(cfg, common.SHARED_DATA / "prompts")["dev"]
    return [t for t, _, _ in random.Random(seed).sample(dev, n)]


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:  # no prompt had such a batch-mate
        return {"n": 0, "mean": None, "p99": None, "max": None}
    v = np.array(values)
    return {"n": len(v), "mean": round(float(v.mean()), 4), "p99": round(float(np.quantile(v, 0.99)), 4),
            "max": round(float(v.max()), 4)}


def measure(model_dir: Path, prompts: list[str], seed: int) -> dict[str, Any]:
    from extproc.inference.models import OnnxModel, Sentinel
    from extproc.inference.runtime import RuntimeOptions

    onnx = OnnxModel(model_dir, "sentinel", RuntimeOptions(provider="cpu", intra_op_threads=1))
    sentinel = Sentinel(onnx)
    threshold = json.loads((model_dir / "truthlens.json").read_text())["provenance"].get("recommended_threshold", 0.5)
    rng = random.Random(seed)
    length = {p: len(onnx.tokenizer.encode(p).ids) for p in prompts}
    single = {p: sentinel.predict_batch([p])[0] for p in prompts}
    repeated, same_len, longer = [], [], []
    for p in prompts:
        repeated.append(abs(sentinel.predict_batch([p, p])[0] - single[p]))
        mates = [q for q in prompts if q != p and length[q] == length[p]]
        if mates:
            same_len.append(abs(sentinel.predict_batch([p, rng.choice(mates)])[0] - single[p]))
        mates = [q for q in prompts if length[q] > length[p] + 10]
        if mates:
            longer.append(abs(sentinel.predict_batch([p, rng.choice(mates)])[0] - single[p]))
    order = prompts[:]
    rng.shuffle(order)
    flips = 0
    for i in range(0, len(order), 8):
        chunk = order[i:i + 8]
        flips += sum((b >= threshold) != (single[p] >= threshold) for p, b in zip(chunk, sentinel.predict_batch(chunk)))
    timings = []
    for p in prompts[:100]:
        sentinel.predict_batch([p])  # warm
        t0 = time.perf_counter()
        sentinel.predict_batch([p])
        timings.append((time.perf_counter() - t0) * 1000)
    shown = model_dir.resolve()
    shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
    return {"model": str(shown), "threshold": threshold, "same_prompt_repeated": _stats(repeated),
            "same_length_mate": _stats(same_len), "longer_mate": _stats(longer),
            "batches_of_8_flips": flips, "single_prompt_ms_p50": round(statistics.median(timings), 2)}


def _cell(stats: dict[str, float | None], *keys: str) -> str:
    return "-" if not stats["n"] else " / ".join(str(stats[k]) for k in keys)


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = ["# Sentinel: batch-mates and int8 activation scales", "",
             f"Command: `.venv/bin/python -m bench.sentinel_batching --prompts {args.prompts} --seed {args.seed}"
             + "".join(f" --compare {c}" for c in args.compare or []) + f" --out {args.out}` (plus the notes below)",
             f"Machine: {machine()}.",
             f"Prompts: {args.prompts} " + (f"from `{args.prompts_file}`" if args.prompts_file else
                                            "sentinel dev prompts (held-out sources)") + ", 1 intra-op thread.", "",
             "|P(factual) in a batch - P alone|, by who shares the batch; flips: decisions that change at the "
             "recommended threshold when the prompts run in random batches of 8.", "",
             "| model | repeated prompt (mean / max) | same-length mate (mean / p99 / max) | longer mate "
             "(mean / p99 / max) | flips in batches of 8 | single prompt p50 |", "|---|---|---|---|---|---|"]
    for r in results:
        s, lg, rep = r["same_length_mate"], r["longer_mate"], r["same_prompt_repeated"]
        lines.append(f"| `{r['model']}` | {_cell(rep, 'mean', 'max')} | {_cell(s, 'mean', 'p99', 'max')} "
                     f"| {_cell(lg, 'mean', 'p99', 'max')} | {r['batches_of_8_flips']} of {args.prompts} "
                     f"| {r['single_prompt_ms_p50']} ms |")
    if args.note:
        lines += ["", "## Notes", "", *[f"* {n}" for n in args.note]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "models/sentinel")
    ap.add_argument("--compare", type=Path, action="append", help="another sentinel directory to measure alike")
    ap.add_argument("--note", action="append", help="a line for the report (e.g. how a --compare graph was made)")
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--prompts-file", type=Path, help="one prompt per line instead of sampled sentinel dev prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "sentinel-batching.md")
    args = ap.parse_args(argv)
    if args.prompts_file:
        prompts = [line.strip() for line in args.prompts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        args.prompts = len(prompts)
    else:
        prompts = dev_prompts(args.prompts, args.seed)
    results = [measure(d, prompts, args.seed) for d in [args.model, *(args.compare or [])]]
    write_results(args.out, report(results, args), results)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
