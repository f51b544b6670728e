"""The real-output suite's arithmetic: fixed dev/test splits, thresholds chosen on dev, per-set rows.

Every candidate (a model, a baseline) is reduced to one `Scored` per example: a response score
(higher = more likely hallucinated) and, optionally, predicted character spans. A row of the
report is one candidate on one set's test part at ONE operating threshold, chosen on the pooled
dev parts of the selection sets (never per set, never on test): that is what a deployment with
one config value gets. Python, numpy and scikit-learn; the driver that loads data and runs models is
`bench/real_output_suite.py`.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from extproc.evaluation.metrics import CharOverlap, Confusion, auroc, finite_order, sklearn_metrics
from extproc.inference.spans import merge_tokens, snap_to_words

SUITE_SALT = "truthlens-suite"


def suite_split(group: str) -> str:
    """'dev' or 'test', half each, by hashing the record's group (its source document or question).

    Every answer about one document lands on one side, so a threshold chosen on dev never saw
    the test documents.
    """
    h = int(hashlib.sha1(f"{SUITE_SALT}:{group}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "dev" if h < 0.5 else "test"


def stable_sample(records: Sequence[dict], n: int | None) -> list[dict]:
    """The same n records on every machine: ordered by a hash of the id, then cut."""
    ordered = sorted(records, key=lambda r: hashlib.sha1(str(r["id"]).encode()).hexdigest())
    return ordered if n is None else ordered[:n]


Segment = tuple[int, int, float]  # characters [start, end) of the answer and their own score


@dataclass(frozen=True, slots=True)
class Scored:
    """One candidate's output for one example."""

    score: float  # higher = more likely hallucinated
    segments: tuple[Segment, ...] | None = None  # tokens or sentences; None: a flag marks the whole answer
    signals: tuple[tuple[str, float], ...] = ()  # extra response-level signals a stacked fit combines with score


@dataclass(frozen=True, slots=True)
class Gold:
    answer: str
    labels: tuple[tuple[int, int], ...]

    @property
    def hallucinated(self) -> bool:
        return bool(self.labels)


def spans_at(scored: Scored, answer: str, threshold: float) -> list[tuple[int, int]]:
    """What a flag at `threshold` marks: segments scoring >= threshold, joined across whitespace,
    snapped to whole words; the whole answer for a candidate without segments (or none that high)."""
    if scored.score < threshold:
        return []
    segments = scored.segments or ()
    merged = merge_tokens(answer, [(s, e) for s, e, _ in segments], [v for *_, v in segments], threshold)
    spans = [snap_to_words(answer, sp.start, sp.end) for sp in merged]
    spans = [(s, e) for s, e in spans if e > s]
    return spans or [(0, len(answer))]


def best_f1_threshold(scores: Sequence[float], gold: Sequence[bool], max_faithful_flagged: float = 1.0) -> float:
    """The score threshold (flag when score >= t) with the best example-level F1 among those that flag
    at most `max_faithful_flagged` of the faithful answers; ties go to the higher t.

    Without the cap a weak score's best F1 is usually "flag nearly everything", which users feel as
    a false alarm on every faithful answer. The sweep over distinct scores is scikit-learn's
    `roc_curve` (every threshold kept); F1 comes from its counts.
    """
    y = np.asarray(gold, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    positives = int(y.sum())
    negatives = int(y.size - positives)
    if y.size == 0 or positives == 0:
        return float("inf")
    order = finite_order(s)
    with warnings.catch_warnings():  # no faithful answers: sklearn warns that the FPR is undefined
        warnings.simplefilter("ignore")
        fpr, tpr, cut = sklearn_metrics().roc_curve(y, order, drop_intermediate=False)
    # point 0 is roc_curve's "flag nothing" (threshold +inf); the rest go from the highest score down
    tp = np.rint(tpr[1:] * positives).astype(np.int64)
    fp = np.rint(fpr[1:] * negatives).astype(np.int64) if negatives else np.zeros(tp.size, dtype=np.int64)
    cut = cut[1:] if order is s else np.unique(s)[cut[1:].astype(np.int64)]
    best_f1, best_t = -1.0, float("inf")
    for t, tp_i, fp_i in zip(cut.tolist(), tp.tolist(), fp.tolist()):
        if negatives and fp_i / negatives > max_faithful_flagged:
            break  # fp only grows as t falls
        f1 = 2 * tp_i / (tp_i + fp_i + positives)
        if f1 > best_f1 + 1e-12:
            best_f1, best_t = f1, t
    return float(best_t)


def row_metrics(scored: Sequence[Scored], gold: Sequence[Gold], threshold: float) -> dict:
    """AUROC, example P/R/F1, span (char) F1 and the share of faithful answers flagged at `threshold`."""
    ex, chars = Confusion(), CharOverlap()
    for s, g in zip(scored, gold):
        ex.add(s.score >= threshold, g.hallucinated)
        chars.add(spans_at(s, g.answer, threshold), list(g.labels))
    prf = ex.prf()
    faithful = prf["fp"] + prf["tn"]
    return {
        "n": len(gold),
        "hallucinated": sum(g.hallucinated for g in gold),
        "auroc": auroc([s.score for s in scored], [g.hallucinated for g in gold]),
        "f1": prf["f1"],
        "precision": prf["precision"],
        "recall": prf["recall"],
        "span_f1": chars.prf()["f1"],
        "faithful_flagged": None if faithful == 0 else prf["fp"] / faithful,
        "threshold": threshold,
    }


def choose_threshold(
    scored: Mapping[str, Sequence[Scored]], gold: Mapping[str, Sequence[Gold]], selection: Iterable[str],
    max_faithful_flagged: float = 1.0,
) -> float:
    """One threshold for all sets: the best F1 on the pooled dev parts of the selection sets
    (flagging at most `max_faithful_flagged` of their faithful answers)."""
    scores: list[float] = []
    labels: list[bool] = []
    for name in selection:
        if name in scored:
            scores += [s.score for s in scored[name]]
            labels += [g.hallucinated for g in gold[name]]
    return best_f1_threshold(scores, labels, max_faithful_flagged)


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"
