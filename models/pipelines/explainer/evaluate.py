"""Explainer scoring: class probabilities per pair, the held-out report and the entailment threshold."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from extproc.inference.templates import nli_pair
from models import shared
from models.pipelines.explainer.data import LABELS, Item


def predict(model, tok, items: Sequence[Item]) -> np.ndarray:
    exs = shared.encode(tok, [nli_pair(p, h) for p, h, _, _ in items], [y for _, _, y, _ in items])
    return shared.predict_proba(model, exs)


def report(items: Sequence[Item], probs: np.ndarray, two_way: Sequence[str]) -> dict[str, Any]:
    """3-way accuracy overall and per source; 2-way sources (no neutral gold) also get
    accuracy with the prediction restricted to entailment vs contradiction."""
    y = [it[2] for it in items]
    pred = probs.argmax(1).tolist()
    rep = shared.classification_report(y, pred, list(LABELS))
    rep["per_source"] = shared.accuracy_by([it[3] for it in items], y, pred)
    for src in two_way:
        idx = [i for i, it in enumerate(items) if it[3] == src]
        if idx:
            sub = probs[idx][:, [0, 2]].argmax(1) * 2
            rep["per_source"][src]["accuracy_2way"] = round(float(np.mean(sub == np.array(y)[idx])), 4)
    return rep


def entailment_threshold(items: Sequence[Item], probs: np.ndarray, precision: float) -> dict[str, Any]:
    """Lowest P(entailment) cut whose entailment precision on the test mix reaches `precision`.

    Dropping a span on a false 'entailed' hides a hallucination, so the default is precision-first.
    If no cut reaches the target, the most precise cut (>= 20 pairs kept) is returned, flagged.
    """
    y = np.array([it[2] for it in items])
    pe = probs[:, 0]
    best: dict[str, Any] | None = None
    for t in np.round(np.arange(0.5, 0.991, 0.01), 2):
        sel = pe >= t
        if sel.sum() < 20:
            break
        prec = float(np.mean(y[sel] == 0))
        found = {"threshold": float(t), "precision": round(prec, 4), "recall": round(float(sel[y == 0].mean()), 4),
                 "target_precision": precision, "target_met": prec >= precision}
        if prec >= precision:
            return found
        if best is None or prec > best["precision"]:
            best = found
    return best or {"threshold": 0.99, "precision": None, "recall": None, "target_precision": precision,
                    "target_met": False}
