"""Evaluation metrics for span-level hallucination detection.

ROC metrics come from scikit-learn (the `eval` extra), imported on first use so that
`truthlens detect` and the modules the serving code shares with it load without it. The span,
character and token counts below have no scikit-learn equivalent and stay here.

Every ratio whose denominator is zero is reported as `None` (JSON null) rather
than 0 or 1: "the detector flagged nothing on a set with no hallucinations" is
neither a perfect nor a failing precision, and a silent 0.0 would hide that.
Counts are always reported next to the ratios so readers can recompute them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

Interval = tuple[int, int]


def merge_intervals(spans: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping, non-empty half-open intervals (overlapping spans count once)."""
    merged: list[list[int]] = []
    for start, end in sorted((int(s), int(e)) for s, e in spans if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def covered_chars(spans: Iterable[Interval]) -> int:
    return sum(e - s for s, e in merge_intervals(spans))


def overlap_chars(pred: Iterable[Interval], gold: Iterable[Interval]) -> int:
    """Characters covered by both span sets (each set merged first)."""
    a, b = merge_intervals(pred), merge_intervals(gold)
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlaps_any(interval: Interval, spans: Sequence[Interval]) -> bool:
    """Whether a half-open interval shares at least one character with any span."""
    s, e = interval
    return any(min(e, ge) > max(s, gs) for gs, ge in spans)


def ratio(num: float, den: float) -> float | None:
    return None if den == 0 else float(num) / float(den)


@dataclass(slots=True)
class Confusion:
    """Binary counts; `prf()` derives precision/recall/F1 (None when undefined)."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, predicted: bool, gold: bool) -> None:
        if predicted and gold:
            self.tp += 1
        elif predicted:
            self.fp += 1
        elif gold:
            self.fn += 1
        else:
            self.tn += 1

    def merge(self, other: "Confusion") -> None:
        self.tp += other.tp
        self.fp += other.fp
        self.fn += other.fn
        self.tn += other.tn

    def prf(self) -> dict[str, float | int | None]:
        return {
            "precision": ratio(self.tp, self.tp + self.fp),
            "recall": ratio(self.tp, self.tp + self.fn),
            "f1": ratio(2 * self.tp, 2 * self.tp + self.fp + self.fn),
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
            "tn": self.tn,
        }


@dataclass(slots=True)
class CharOverlap:
    """Character-level span overlap pooled over a set (micro-averaged, not per example)."""

    overlap: int = 0
    predicted: int = 0
    gold: int = 0

    def add(self, pred: Sequence[Interval], gold: Sequence[Interval]) -> None:
        self.overlap += overlap_chars(pred, gold)
        self.predicted += covered_chars(pred)
        self.gold += covered_chars(gold)

    def merge(self, other: "CharOverlap") -> None:
        self.overlap += other.overlap
        self.predicted += other.predicted
        self.gold += other.gold

    def prf(self) -> dict[str, float | int | None]:
        return {
            "precision": ratio(self.overlap, self.predicted),
            "recall": ratio(self.overlap, self.gold),
            "f1": ratio(2 * self.overlap, self.predicted + self.gold),
            "overlap_chars": self.overlap,
            "predicted_chars": self.predicted,
            "gold_chars": self.gold,
        }


def token_confusion(
    token_offsets: Sequence[Interval], token_probs: Sequence[float], gold: Sequence[Interval], threshold: float
) -> Confusion:
    """Per answer token: gold positive if its chars overlap a gold span, predicted if p >= threshold.

    Tokens with an empty character span (special tokens, some byte-level pieces)
    carry no characters and are skipped.
    """
    if len(token_offsets) != len(token_probs):
        raise ValueError(f"{len(token_offsets)} token offsets but {len(token_probs)} probabilities")
    merged = merge_intervals(gold)
    counts = Confusion()
    for (s, e), p in zip(token_offsets, token_probs):
        if e <= s:
            continue
        counts.add(float(p) >= threshold, overlaps_any((s, e), merged))
    return counts


EVAL_EXTRA = "pip install 'truthlens[eval]'"


def missing_eval_packages() -> list[str]:
    """Import names of the `eval` extra's packages that are not installed (empty when all are)."""
    import importlib.util

    return [m for m in ("sklearn", "tqdm") if importlib.util.find_spec(m) is None]


def sklearn_metrics():  # type: ignore[no-untyped-def]
    """`sklearn.metrics`, or an ImportError that names the extra to install."""
    try:
        from sklearn import metrics
    except ImportError as exc:
        raise ImportError(f"ROC/PR metrics need scikit-learn, in the eval extra: {EVAL_EXTRA}") from exc
    return metrics


def finite_order(scores: np.ndarray) -> np.ndarray:
    """`scores` itself when every value is finite, else their dense ranks (same order, same ties).

    scikit-learn rejects infinite scores; ROC and threshold sweeps depend only on the order.
    """
    if np.isfinite(scores).all():
        return scores
    return np.unique(scores, return_inverse=True)[1].reshape(scores.shape).astype(np.float64)


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (scikit-learn's `roc_auc_score`; tied scores count half).

    None when only one class is present: the curve is undefined, and 0.5 would
    pretend a measurement was made.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape:
        raise ValueError(f"{s.size} scores but {y.size} labels")
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        return None
    return float(sklearn_metrics().roc_auc_score(y, finite_order(s)))


def flagged_at_recall(scores: Sequence[float], labels: Sequence[bool], recall: float) -> float | None:
    """The share of negatives (faithful answers) flagged at the highest threshold that still flags `recall`
    of the positives: what an operator pays in false alarms for that catch rate. None without both classes."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if y.all() or not y.any():
        return None
    pos = np.sort(s[y])[::-1]
    threshold = pos[max(int(np.ceil(recall * pos.size)) - 1, 0)]  # the k-th highest positive score, k = ceil(recall n)
    return float((s[~y] >= threshold).mean())


def auroc_difference_resamples(a: Sequence[float], b: Sequence[float], labels: Sequence[bool],
                               resamples: int = 2000, seed: int = 0) -> tuple[float, np.ndarray] | None:
    """AUROC(a) - AUROC(b) on the same answers, and that difference on `resamples` paired bootstrap samples
    (answers drawn with replacement, both scores of an answer kept together; a draw without both classes is
    drawn again). None when one class is missing. Averaging the arrays of several sets gives the mean's."""
    from scipy.stats import rankdata

    sa, sb = finite_order(np.asarray(a, dtype=np.float64)), finite_order(np.asarray(b, dtype=np.float64))
    y = np.asarray(labels, dtype=bool)
    if not (sa.shape == sb.shape == y.shape):
        raise ValueError(f"{sa.size} and {sb.size} scores but {y.size} labels")
    if y.all() or not y.any():
        return None

    def auc(s: np.ndarray, yy: np.ndarray) -> np.ndarray:  # rows of a 2-D batch; ties count half (mid-ranks)
        ranks = rankdata(s, axis=-1)
        pos = yy.sum(axis=-1)
        return ((ranks * yy).sum(axis=-1) - pos * (pos + 1) / 2) / (pos * (yy.shape[-1] - pos))

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, y.size, size=(resamples, y.size))
    both = y[idx].any(axis=1) & ~y[idx].all(axis=1)
    while not both.all():
        idx[~both] = rng.integers(0, y.size, size=(int((~both).sum()), y.size))
        both = y[idx].any(axis=1) & ~y[idx].all(axis=1)
    diff = float(auc(sa[None], y[None])[0] - auc(sb[None], y[None])[0])
    return diff, auc(sa[idx], y[idx]) - auc(sb[idx], y[idx])


def interval(point: float, resampled: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """A bootstrap percentile interval around `point`, and the share of resamples at or below 0."""
    lo, hi = np.percentile(resampled, [50 * (1 - level), 50 * (1 + level)])
    return {"diff": point, "low": float(lo), "high": float(hi), "share_le_0": float((resampled <= 0).mean())}


def latency_summary(values_ms: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p95 with linear interpolation (numpy's default), plus mean and max."""
    if len(values_ms) == 0:
        return {"count": 0, "p50": None, "p95": None, "mean": None, "max": None}
    v = np.asarray(values_ms, dtype=np.float64)
    return {
        "count": int(v.size),
        "p50": float(np.percentile(v, 50)),
        "p95": float(np.percentile(v, 95)),
        "mean": float(v.mean()),
        "max": float(v.max()),
    }
