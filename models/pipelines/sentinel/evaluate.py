"""Sentinel scoring: p(factual) per prompt, the dev report, the threshold (fp32 checkpoint and served graph alike)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from extproc.inference.templates import sentinel_text
from models import shared
from models.pipelines.sentinel.data import LABELS, Item


def pick_threshold(p_factual: np.ndarray, y: np.ndarray) -> float:
    """Threshold that maximises balanced accuracy on dev (ties -> closest to 0.5)."""
    best, best_t = -1.0, 0.5
    for t in sorted(set(np.round(np.linspace(0.05, 0.95, 91), 2)), key=lambda v: abs(v - 0.5)):
        pred = (p_factual >= t).astype(int)
        bal = np.mean([np.mean(pred[y == c] == c) for c in (0, 1) if np.any(y == c)])
        if bal > best + 1e-9:
            best, best_t = bal, float(t)
    return best_t


def predict(model, tok, items: Sequence[Item]) -> np.ndarray:
    """p(factual) per item from the torch model, inputs built with the serving template."""
    exs = shared.encode(tok, [sentinel_text(t) for t, _, _ in items], [y for _, y, _ in items])
    return shared.predict_proba(model, exs)[:, 1]


def report(items: Sequence[Item], p: np.ndarray, threshold: float) -> dict[str, Any]:
    y = np.array([lab for _, lab, _ in items])
    pred = (p >= threshold).astype(int)
    rep = shared.classification_report(y.tolist(), pred.tolist(), LABELS)
    rep["balanced_accuracy"] = round(float(np.mean([np.mean(pred[y == c] == c) for c in (0, 1) if np.any(y == c)])), 4)
    rep["threshold"] = threshold
    rep["per_source"] = shared.accuracy_by([s for _, _, s in items], y.tolist(), pred.tolist())
    return rep
