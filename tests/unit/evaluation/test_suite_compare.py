"""bench.real_output_suite.compare: per-set AUROC differences with bootstrap intervals, and their mean over
the sets that are not report-only."""

from __future__ import annotations

import numpy as np
import pytest

from bench.real_output_suite import compare, render
from extproc.evaluation.metrics import auroc


def test_compare_gives_each_set_and_the_mean_without_the_report_only_set() -> None:
    rng = np.random.default_rng(0)
    test: dict = {"served": {}, "detector_max": {}}
    for name, skill in (("expertqa", 1.5), ("real_rag", -1.0), ("faithdial", 3.0)):
        y = list(rng.random(150) < 0.5)
        test["served"][name] = (list(np.array(y) * skill + rng.normal(0, 1, 150)), y)
        test["detector_max"][name] = (list(rng.normal(0, 1, 150)), y)
    keep = {c: {"dev": {}, "test": by_set} for c, by_set in test.items()}
    (c,) = compare(keep, resamples=400)  # the other default pairs lack a candidate: left out
    assert (c["a"], c["b"]) == ("served", "detector_max") and set(c["sets"]) == {"expertqa", "real_rag", "faithdial"}
    for name, v in c["sets"].items():
        want = auroc(*test["served"][name]) - auroc(test["detector_max"][name][0], test["served"][name][1])
        assert v["diff"] == pytest.approx(want) and v["low"] <= v["diff"] <= v["high"]
    assert c["sets"]["expertqa"]["low"] > 0 and c["sets"]["real_rag"]["high"] < 0  # clear wins and losses
    assert c["mean"]["diff"] == pytest.approx((c["sets"]["expertqa"]["diff"] + c["sets"]["real_rag"]["diff"]) / 2)
    text = render({"command": "x", "machine": "m", "date": "d", "per_split": 150, "selection": ["expertqa"],
                   "max_faithful_flagged": 0.25, "sets": {}, "candidates": {}, "comparisons": [c]})
    assert "| real_rag | " in text and "| **mean** | " in text


def test_at_recall_reports_each_candidate_and_split() -> None:
    from bench.real_output_suite import at_recall

    y = [True, True, True, False, False, False, False]
    keep = {"good": {"dev": {"real_rag": ([0.9, 0.8, 0.7, 0.1, 0.2, 0.3, 0.75], y)}, "test": {}},
            "flat": {"dev": {"real_rag": ([0.5] * 7, y)}, "test": {"real_rag": ([0.5] * 7, y)}}}
    bar = at_recall(keep, "real_rag", 0.6)  # 2 of 3 caught at 0.8: none of the faithful scores reach it
    assert bar["candidates"] == {"good": {"dev": 0.0, "test": None}, "flat": {"dev": 1.0, "test": 1.0}}
