"""The real-output suite's arithmetic: fixed dev/test splits, thresholds chosen on dev, per-set rows.

Every candidate (a model, a baseline) is reduced to one `Scored` per example: a response score
(higher = more likely hallucinated) and, optionally, predicted character spans. A row of the
report is one candidate on one set's test part at ONE operating threshold, chosen on the pooled
dev parts of the selection sets (never per set, never on test): that is what a deployment with
one config value gets. Pure Python + numpy; the driver that loads data and runs models is
`bench/real_output_suite.py`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from extproc.evaluation.metrics import CharOverlap, Confusion, auroc
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
    a false alarm on every faithful answer.
    """
    pairs = sorted(zip(scores, gold), key=lambda p: -p[0])
    positives = sum(gold)
    negatives = len(pairs) - positives
    if not pairs or positives == 0:
        return float("inf")
    best_f1, best_t, tp, fp = -1.0, float("inf"), 0, 0
    for i, (s, g) in enumerate(pairs):
        tp += int(g)
        fp += int(not g)
        if i + 1 < len(pairs) and pairs[i + 1][0] == s:
            continue  # a threshold cannot split tied scores
        if negatives and fp / negatives > max_faithful_flagged:
            break
        f1 = 2 * tp / (tp + fp + positives)
        if f1 > best_f1 + 1e-12:
            best_f1, best_t = f1, s
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
