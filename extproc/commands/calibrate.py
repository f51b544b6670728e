"""`truthlens calibrate --data FILE.jsonl --out calibration.npz`: fit LatentAudit on labelled answers.

Reads every example with the surrogate LM (one grounded pass with hidden states, one without
the passages), fits the projector, the faithful class's Ledoit-Wolf covariance and Youden's
threshold (`extproc.inference.latent_audit`), checks the 16-bit fixed-point scorer against
float on the same answers, writes the file (it records the surrogate's GGUF sha256: the
sidecar refuses it for another model) and prints a JSON report. Use labelled answers written by
real models (the format of `truthlens eval`): the threshold is only as good as that data.
Exit 2 on bad input, 1 when the surrogate cannot be loaded, the fit fails or scikit-learn (the `eval`
extra) is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="FILE.jsonl", help="labelled examples (truthlens eval format)")
    parser.add_argument("--out", required=True, metavar="calibration.npz", help="where to write the LatentAudit file")
    parser.add_argument("--surrogate", default="models/surrogate", metavar="DIR", help="surrogate LM directory")
    parser.add_argument("--k", type=int, default=4, help="projected dimensions (the ridge direction + k-1 principal ones)")
    parser.add_argument("--ridge", type=float, default=1.0, help="ridge penalty (times the number of rows)")
    parser.add_argument("--threshold-split", type=float, default=0.5,
                        help="share of the examples held out of the fit to choose the threshold (Youden's J)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = default)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from extproc.evaluation.dataset import DatasetError, load_jsonl
    from extproc.evaluation.metrics import EVAL_EXTRA, auroc, missing_eval_packages
    from extproc.inference.latent_audit import (
        AuditError,
        FixedPointAudit,
        audit_features,
        decision_agreement,
        fit_latent_audit,
    )
    from extproc.inference.runtime import RuntimeOptions
    from extproc.inference.surrogate import SurrogateLM

    if "sklearn" in missing_eval_packages():  # the report's AUROC
        print(f"error: truthlens calibrate needs scikit-learn, in the eval extra: {EVAL_EXTRA}", file=sys.stderr)
        return 1
    try:
        examples = [e for e in load_jsonl(args.data) if e.context]
    except DatasetError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        lm = SurrogateLM(args.surrogate, RuntimeOptions("cpu", args.threads))
    except (OSError, ValueError) as exc:
        print(f"calibrate: surrogate: {exc}", file=sys.stderr)
        return 1
    if not lm.manifest.hidden_layers:
        print(f"calibrate: {args.surrogate} exports no hidden states (truthlens export --hidden-layers)", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    rows, labels = [], []
    for ex in examples:
        reading = lm.read(ex.context, ex.question, ex.answer, hidden=True)
        if reading.hidden is not None:
            rows.append(audit_features(reading.hidden))
            labels.append(ex.hallucinated)
    x = np.array(rows)
    try:
        audit = fit_latent_audit(x, labels, model_sha256=str(lm.manifest.provenance.get("gguf_sha256")),
                                 layers=lm.manifest.hidden_layers, k=args.k, ridge=args.ridge,
                                 threshold_split=args.threshold_split, data=str(args.data), examples=len(rows),
                                 hallucinated=int(sum(labels)))
    except AuditError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 1
    fixed = FixedPointAudit.from_float(audit, input_range=np.abs(x).max(axis=0))
    audit.fitted_on["fixed_point_agreement"] = decision_agreement(audit, fixed, x)
    audit.save(args.out)
    distances = [audit.distance(v) for v in x]
    report = {"out": args.out, "examples": len(rows), "hallucinated": int(sum(labels)), "threshold": audit.threshold,
              "auroc_all_rows": auroc(distances, labels), "seconds": round(time.perf_counter() - t0, 1),
              **audit.fitted_on}
    print(json.dumps(report, indent=2))
    return 0
