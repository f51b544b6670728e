"""Run a scorer over a dataset and pool the metrics, overall and per task.

The runner only needs a callable `Example -> Prediction`, so the metric
pipeline is tested without models and the model adapter
(`extproc.evaluation.scorer`) stays a thin layer over the inference package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from extproc.evaluation.dataset import Example
from extproc.evaluation.metrics import CharOverlap, Confusion, Interval, auroc, latency_summary, token_confusion
from extproc.evaluation.progress import Progress

NO_TASK = "(none)"

DEFINITIONS = {
    "example_level": "an answer is predicted hallucinated when the detector returns at least one span "
    "(after span filtering and NLI dropping); gold = the record has at least one label",
    "span_level_char": "character overlap between predicted and gold spans, pooled over the whole set "
    "(micro-average): precision = overlap / predicted chars, recall = overlap / gold chars",
    "token_level": "over the detector's answer tokens: gold positive when the token's character span "
    "overlaps a gold span, predicted positive when its hallucination probability >= thresholds.token "
    "(raw model output, before span filtering and NLI); tokens with empty character spans are skipped",
    "auroc": "example-level: score = the response score the gateway reports (x-truthlens-score: calibrated when "
    "the detector ships a calibration for truthlens.score_method), gold = has any label; null when the set "
    "has only one class",
    "latency_ms": "wall time of one example through the detector (+ explainer), windowing included",
    "unchecked": "examples the gateway would pass unchecked, by reason (too_large: over batching.max_request_tokens); "
    "they count as not flagged, score 0, as the user would see them",
    "null": "a ratio whose denominator is zero is reported as null, not 0 or 1",
}


@dataclass(frozen=True, slots=True)
class PredictedSpan:
    start: int
    end: int
    text: str
    score: float
    nli_label: str | None = None
    nli_confidence: float | None = None


@dataclass(frozen=True, slots=True)
class Prediction:
    """What one example produced; token offsets are character offsets into the answer."""

    spans: tuple[PredictedSpan, ...]
    score: float  # response-level score from the detector
    token_offsets: tuple[Interval, ...]
    token_probs: tuple[float, ...]
    windows: int = 1
    latency_ms: float = 0.0
    unchecked: str | None = None  # why the gateway would not judge it (e.g. "too_large"); then nothing is flagged

    @property
    def max_token_prob(self) -> float:
        return max(self.token_probs, default=0.0)


@dataclass(slots=True)
class Accumulator:
    examples: int = 0
    example: Confusion = field(default_factory=Confusion)
    chars: CharOverlap = field(default_factory=CharOverlap)
    tokens: Confusion = field(default_factory=Confusion)
    scores: list[float] = field(default_factory=list)
    gold: list[bool] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)
    unchecked: dict[str, int] = field(default_factory=dict)

    def add(self, ex: Example, pred: Prediction, token_threshold: float) -> None:
        pred_spans = [(s.start, s.end) for s in pred.spans]
        self.examples += 1
        self.example.add(bool(pred_spans), ex.hallucinated)
        self.chars.add(pred_spans, ex.labels)
        self.tokens.merge(token_confusion(pred.token_offsets, pred.token_probs, ex.labels, token_threshold))
        self.scores.append(pred.score)
        self.gold.append(ex.hallucinated)
        self.latencies.append(pred.latency_ms)
        self.windows.append(pred.windows)
        if pred.unchecked is not None:
            self.unchecked[pred.unchecked] = self.unchecked.get(pred.unchecked, 0) + 1

    def metrics(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "hallucinated_examples": sum(self.gold),
            "example_level": self.example.prf(),
            "span_level_char": self.chars.prf(),
            "token_level": self.tokens.prf(),
            "auroc": auroc(self.scores, self.gold),
            "latency_ms": latency_summary(self.latencies),
            "windows": {
                "mean": (sum(self.windows) / len(self.windows)) if self.windows else None,
                "max": max(self.windows, default=None),
            },
            "unchecked": dict(sorted(self.unchecked.items())),
        }


def evaluate(
    examples: Sequence[Example],
    scorer: Callable[[Example], Prediction],
    token_threshold: float,
    progress: Progress | None = None,
    on_prediction: Callable[[Example, Prediction], None] | None = None,
) -> dict[str, Any]:
    """Score every example; returns overall metrics plus a `by_task` breakdown."""
    overall = Accumulator()
    by_task: dict[str, Accumulator] = {}
    for ex in examples:
        pred = scorer(ex)
        _check(ex, pred)
        overall.add(ex, pred, token_threshold)
        by_task.setdefault(ex.task or NO_TASK, Accumulator()).add(ex, pred, token_threshold)
        if on_prediction is not None:
            on_prediction(ex, pred)
        if progress is not None:
            progress.update()
    if progress is not None:
        progress.close()
    report = overall.metrics()
    report["by_task"] = {task: acc.metrics() for task, acc in sorted(by_task.items())}
    report["definitions"] = DEFINITIONS
    return report


def _check(ex: Example, pred: Prediction) -> None:
    """A span outside the answer is a detector bug; fail loudly instead of scoring garbage."""
    n = len(ex.answer)
    for s in pred.spans:
        if not 0 <= s.start < s.end <= n:
            raise ValueError(f"example {ex.id!r}: predicted span [{s.start}, {s.end}) outside answer of length {n}")


def prediction_record(ex: Example, pred: Prediction) -> dict[str, Any]:
    """One line of `--predictions` output: enough to recompute every metric offline."""
    return {
        "id": ex.id,
        "task": ex.task,
        "labels": [{"start": s, "end": e} for s, e in ex.labels],
        "spans": [
            {
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "score": round(s.score, 6),
                "nli_label": s.nli_label,
                "nli_confidence": None if s.nli_confidence is None else round(s.nli_confidence, 6),
            }
            for s in pred.spans
        ],
        "score": round(pred.score, 6),
        "max_token_prob": round(pred.max_token_prob, 6),
        "windows": pred.windows,
        "latency_ms": round(pred.latency_ms, 3),
        "unchecked": pred.unchecked,
    }


def iter_tasks(report: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    yield "ALL", report
    yield from report.get("by_task", {}).items()
