"""What a 512-token detector window costs by encoder and depth: is a smaller MiniLM the way to 25 ms, and what
does the quality tier's MPNet cost?

    .venv/bin/python -m bench.detector_depth --layers 2 3 4 6
    .venv/bin/python -m bench.detector_depth --base mpnet --layers 12 --out bench/results/detector-depth-mpnet.md

Keeps the first N layers of the base encoder (all-MiniLM-L6-v2, or all-mpnet-base-v2 after `make setup-mpnet`;
untrained token-classification head: latency only, no quality), exports each through `extproc.inference.export`
as the bundled detectors are (int8, per-channel; fused attention where onnxruntime's optimizer knows the
architecture: BERT, not MPNet), and times one onnxruntime session run on a 512-token row with 2 and 1
intra-op threads. Writes bench/results/detector-depth.md (+ .json). Needs the `train` extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import RESULTS, command, machine, time_ms, write_results

BASES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}
WINDOWING_MS = 1.5  # end to end minus session time for one 512-token window (bench/results/inference.md)


def time_session(path: Path, threads: int, runs: int, length: int = 512) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the sidecar runs it
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    # Word-piece ids drawn like real text: a row of one repeated id runs ~15% slower than real input.
    ids = np.random.default_rng(0).integers(1000, 20000, (1, length), dtype=np.int64)
    feed = {i.name: ids if i.name == "input_ids" else np.ones((1, length), dtype=np.int64) for i in s.get_inputs()}
    if "token_type_ids" in feed:
        feed["token_type_ids"] = np.zeros((1, length), dtype=np.int64)
    return float(np.median(time_ms(lambda: s.run(None, feed), runs)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", choices=sorted(BASES), default="minilm", help="base encoder")
    p.add_argument("--layers", type=int, nargs="+", default=[2, 3, 4, 6])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", default=str(RESULTS / "detector-depth.md"))
    args = p.parse_args()
    from transformers import AutoConfig, AutoModelForTokenClassification

    from extproc.inference.export import export_model
    from models import shared as common

    base = common.base_model_dir(BASES[args.base])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.layers:
            cfg = AutoConfig.from_pretrained(str(base), num_hidden_layers=n, num_labels=2)
            model = AutoModelForTokenClassification.from_pretrained(str(base), config=cfg)
            fused = cfg.model_type == "bert"  # the only architecture onnxruntime's optimizer fuses here
            hf, out = Path(tmp) / f"hf{n}", Path(tmp) / f"onnx{n}"
            model.save_pretrained(str(hf))
            for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
                if (base / name).is_file():
                    shutil.copy(base / name, hf / name)
            export_model(hf, "token-classification", out, quantize="int8", per_channel=True, optimize=fused,
                         max_length=512, labels=["supported", "hallucinated"])
            row = {"base": BASES[args.base], "layers": n, "fused": fused, "mb": round((out / "model.onnx").stat().st_size / 1e6, 1),
                   "p50_ms_2_threads": round(time_session(out / "model.onnx", 2, args.runs), 1),
                   "p50_ms_1_thread": round(time_session(out / "model.onnx", 1, args.runs), 1)}
            print(row, flush=True)
            rows.append(row)
    host = machine("at end", kernel=False)
    shape = {"minilm": "384 hidden, 12 heads", "mpnet": "768 hidden, 12 heads, 110M parameters"}[args.base]
    lines = ["# Detector window cost by encoder depth", "",
             f"Command: `{command('bench.detector_depth')}`", "",
             f"Machine: {host}; onnxruntime CPU, spinning off.", "",
             f"First N layers of {BASES[args.base].split('/')[1]} ({shape}), exported like the bundled detectors "
             f"({'fused attention, ' if rows and rows[0]['fused'] else 'no fused attention (onnxruntime has no optimizer for it), '}"
             f"int8, per-channel), one 512-token row, median of {args.runs} session runs. Latency only: these heads are untrained.", "",
             "| layers | model MB | p50 ms, 2 threads | p50 ms, 1 thread |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['layers']} | {r['mb']} | {r['p50_ms_2_threads']} | {r['p50_ms_1_thread']} |" for r in rows]
    meets = [str(r["layers"]) for r in rows if r["p50_ms_2_threads"] + WINDOWING_MS <= 25.0]
    lines += ["", f"Depths that meet the 25 ms target for one 512-token window on 2 cores end to end (session p50 + "
              f"~{WINDOWING_MS} ms of tokenizing and windowing, as `python -m bench.inference_bench` measures for the trained "
              f"detectors): {', '.join(meets) or 'none'}."]
    out_path = write_results(args.out, "\n".join(lines) + "\n", {"machine": host, "rows": rows})
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
