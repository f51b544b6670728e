"""`truthlens eval --data FILE.jsonl --out metrics.json`: measure the detector on labelled data.

Writes the full report (overall, per task, definitions, settings) as JSON and
prints a table. Exit 0 on success, 2 on bad input (every bad line is listed),
1 when the models cannot be loaded or the `eval` extra (scikit-learn, tqdm) is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="FILE.jsonl", help="labelled examples, one JSON object per line")
    parser.add_argument("--out", required=True, metavar="metrics.json", help="where to write the JSON report")
    add_model_arguments(parser)
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="evaluate only the first N examples")
    parser.add_argument(
        "--predictions", metavar="FILE.jsonl", default=None, help="also write one line of predictions per example"
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress bar on stderr (auto: only when stderr is a terminal)",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Shared by `eval` and `detect`: where the models and thresholds come from."""
    parser.add_argument(
        "--config", metavar="FILE.yaml", default=None, help="TruthLens config: thresholds and model paths"
    )
    parser.add_argument(
        "--model-dir",
        metavar="DIR",
        default=None,
        help="detector model directory (default: the config's truthlens.models.detector; auto, the default, is "
             "models/detector-full where its session runs on CUDA and models/detector elsewhere)",
    )
    parser.add_argument(
        "--explainer-dir",
        metavar="DIR",
        default=None,
        help="NLI explainer model directory (default: the config's, else models/explainer)",
    )
    parser.add_argument("--no-explainer", action="store_true", help="skip NLI labelling and entailment dropping")
    parser.add_argument(
        "--token-threshold", type=float, default=None, metavar="P",
        help="override truthlens.thresholds.token (a token is flagged when p(hallucinated) >= P)",
    )
    parser.add_argument(
        "--min-span-confidence", type=float, default=None, metavar="P",
        help="override truthlens.thresholds.min_span_confidence (spans whose best token is below P are dropped)",
    )


def run(args: argparse.Namespace) -> int:
    from extproc.evaluation.dataset import DatasetError, load_jsonl
    from extproc.evaluation.metrics import EVAL_EXTRA, missing_eval_packages
    from extproc.evaluation.scorer import ScorerError, open_scorer

    missing = missing_eval_packages()
    if missing:  # before reading data or loading models
        print(f"error: truthlens eval needs the eval extra ({', '.join(missing)} not installed): {EVAL_EXTRA}",
              file=sys.stderr)
        return 1
    try:
        examples = load_jsonl(args.data)
    except DatasetError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print(f"INVALID: {args.data} ({len(exc.errors)} problem(s))", file=sys.stderr)
        return 2
    if args.limit is not None:
        examples = examples[: max(args.limit, 0)]
    try:  # fail before loading models, not after an hour of scoring
        for target in (args.out, args.predictions):
            if target:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot create output directory: {exc}", file=sys.stderr)
        return 2

    try:
        scorer = open_scorer(args)
    except ScorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        return _evaluate(args, examples, scorer)
    except ScorerError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    finally:
        scorer.close()


def _evaluate(args: argparse.Namespace, examples: list, scorer) -> int:  # type: ignore[type-arg]
    from extproc.evaluation.progress import Progress
    from extproc.evaluation.report import format_table
    from extproc.evaluation.runner import evaluate, prediction_record

    if examples:
        scorer.warm_up(examples[0])
    progress = Progress(len(examples), enabled=Progress.auto(args.progress))
    pred_file = open(args.predictions, "w", encoding="utf-8") if args.predictions else None
    started = time.perf_counter()
    try:

        def write_prediction(ex, pred) -> None:  # type: ignore[no-untyped-def]
            if pred_file is not None:
                pred_file.write(json.dumps(prediction_record(ex, pred), ensure_ascii=False) + "\n")

        report = evaluate(examples, scorer.score, scorer.token_threshold, progress, write_prediction)
    finally:
        if pred_file is not None:
            pred_file.close()
    report = {
        "data": str(args.data),
        "settings": scorer.describe(),
        "wall_s": round(time.perf_counter() - started, 3),
        **report,
    }
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(format_table(report))
    print(f"wrote {out}")
    return 0
