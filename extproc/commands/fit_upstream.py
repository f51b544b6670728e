"""`truthlens fit-upstream --data FILE.jsonl --out upstream-fusion.json`: per writer model, stack the response
score with that model's own token logprobs (`truthlens.signals.upstream_fusion` loads the file).

One JSON object per line, what the gateway reports per checked answer plus your label:
`{"model": "<the response's model>", "score": <truthlens.score>, "upstream": {"mean_logprob": ...,
"min_logprob": ..., "mean_entropy": ...}, "hallucinated": true|false}`. `score` and `upstream` are the verdict
event's fields (or the `x-truthlens-score` / `x-truthlens-upstream-*` headers), recorded with
`signals.upstream_logprobs` on and `upstream_fusion` unset. A logistic fit per model (Newton steps, the same
as the score calibration) of the label on logit(score) and the chosen signals; a model with fewer than
`--min-answers` answers, or without both labels, gets no fit and keeps its score. Logprob scales belong to
their model: a fit is used only for the models it was made on. The fit also weighs the score of the detector
and calibration that produced it: refit after changing either. The report's AUROCs are in-sample; judge a
fit on answers it was not fitted on (bench/results/writer-logprobs.md does, for SmolLM2).
Exit 2 on bad input, 1 when no model has enough answers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from extproc.inference.upstream import SIGNALS

PREFIX = "upstream_"  # a fit names its signals as the gateway does (`upstream.signal_values`); the file's fields drop it
NAMES = tuple(s.removeprefix(PREFIX) for s in SIGNALS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="FILE.jsonl", help="labelled answers (see the command's doc)")
    parser.add_argument("--out", required=True, metavar="FILE.json", help="where to write the writer fits")
    parser.add_argument("--signals", nargs="+", choices=NAMES, default=["min_logprob"],
                        help="the writer's numbers to stack on the score (default: min_logprob, the one with skill "
                             "for SmolLM2 in bench/results/writer-logprobs.md)")
    parser.add_argument("--min-answers", type=int, default=40, help="fewer answers of a model: no fit for it")


def read_rows(path: Path, signals: list[str]) -> dict[str, list[tuple[float, dict[str, float], bool]]]:
    """model -> (score, upstream signal values, hallucinated); ValueError naming the line on bad input."""
    out: dict[str, list[tuple[float, dict[str, float], bool]]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            model, score, up, label = row["model"], float(row["score"]), row["upstream"], row["hallucinated"]
            values = {PREFIX + k: float(up[k]) for k in signals}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: expected model, score, upstream.{{{','.join(signals)}}} and "
                             f"hallucinated ({exc!r})") from exc
        if not isinstance(model, str) or not model or not isinstance(label, bool) or not 0.0 <= score <= 1.0 \
                or not all(math.isfinite(v) for v in values.values()):
            raise ValueError(f"{path}:{n}: model must be a non-empty string, hallucinated a boolean, score in "
                             "[0, 1] and the signals finite numbers")
        out.setdefault(model, []).append((score, values, label))
    return out


def run(args: argparse.Namespace) -> int:
    from extproc.evaluation.metrics import EVAL_EXTRA, auroc, missing_eval_packages
    from extproc.inference.calibration import CalibrationError, CalibrationSet, fit_platt
    from extproc.inference.upstream import RAW_SCORE

    if "sklearn" in missing_eval_packages():  # the report's AUROC
        print(f"error: truthlens fit-upstream needs scikit-learn, in the eval extra: {EVAL_EXTRA}", file=sys.stderr)
        return 1
    try:
        by_model = read_rows(Path(args.data), list(args.signals))
    except (OSError, ValueError) as exc:
        print(f"fit-upstream: {exc}", file=sys.stderr)
        return 2
    fits, report = [], {}
    for model, rows in sorted(by_model.items()):
        labels = [h for _, _, h in rows]
        entry: dict[str, Any] = {"answers": len(rows), "hallucinated": sum(labels)}
        report[model] = entry
        if len(rows) < args.min_answers or all(labels) or not any(labels):
            entry["fit"] = None
            entry["why"] = f"needs at least {args.min_answers} answers with both labels"
            continue
        names = sorted(rows[0][1])
        try:
            fit = fit_platt([s for s, _, _ in rows], labels, RAW_SCORE,
                            signals={k: [v[k] for _, v, _ in rows] for k in names},
                            fitted_on={"upstream_models": [model], "answers": len(rows),
                                       "hallucinated": sum(labels), "data": str(args.data),
                                       "command": f"truthlens fit-upstream --data {args.data} --out {args.out} "
                                                  f"--signals {' '.join(args.signals)} --min-answers {args.min_answers}"})
        except CalibrationError as exc:
            entry["fit"] = None
            entry["why"] = str(exc)
            continue
        fits.append(fit)
        fused = [fit(s, v) for s, v, _ in rows]
        entry.update(fit={"a": fit.a, "b": fit.b, "signals": fit.signals},
                     auroc_in_sample={"score": auroc([s for s, _, _ in rows], labels), "fused": auroc(fused, labels)})
    print(json.dumps(report, indent=2))
    if not fits:
        print("fit-upstream: no model has enough labelled answers; nothing written", file=sys.stderr)
        return 1
    CalibrationSet(tuple(fits)).write(args.out)
    print(f"wrote {args.out}: fits for {[f.fitted_on['upstream_models'][0] for f in fits]}", file=sys.stderr)
    return 0
