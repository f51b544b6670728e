"""The committed explainer (models/explainer) loads through the serving path and orders
P(entailment) sensibly on clear-cut pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.inference.models import Explainer, OnnxModel
from extproc.inference.runtime import RuntimeOptions

MODEL = Path(__file__).resolve().parents[3] / "models" / "explainer"
PREMISE = "A man in a red shirt is playing a guitar on a stage in front of a crowd."


@pytest.fixture(scope="module")
def explainer() -> Explainer:
    return Explainer(OnnxModel(MODEL, "explainer", RuntimeOptions(provider="cpu", intra_op_threads=1)))


def test_manifest_is_the_nli_contract():
    m = json.loads((MODEL / "truthlens.json").read_text())
    assert m["task"] == "nli"
    assert m["labels"] == ["entailment", "neutral", "contradiction"]
    assert m["provenance"]["parity"]["ok"]
    assert 0.5 <= m["provenance"]["recommended_threshold"] < 1.0


def test_restated_premise_is_entailed(explainer):
    res = explainer.predict_batch([PREMISE], [PREMISE])
    assert res[0].label == "entailment"


def test_supported_claim_scores_above_contradicted_claim(explainer):
    res = explainer.predict_batch([PREMISE], ["A man is playing a guitar.", "Nobody is playing any music."])
    assert res[0].entailment > res[1].entailment
    assert res[1].label != "entailment"
