"""The committed sentinel (models/sentinel) loads through the serving path and separates
obvious factual questions from obvious non-factual requests at its recommended threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.inference.models import OnnxModel, Sentinel
from extproc.inference.runtime import RuntimeOptions

MODEL = Path(__file__).resolve().parents[3] / "models" / "sentinel"

FACTUAL = [
    "Who was the first president of the United States?",
    "What is the boiling point of water at sea level in Celsius?",
    "when did the berlin wall fall",
    "Which country has the largest population in Africa?",
]
NON_FACTUAL = [
    "Write a Python function that reverses a linked list.",
    "Write a haiku about autumn leaves.",
    "Pretend you are a pirate captain and greet your crew.",
    "If Tom has 3 apples and buys 5 more, how many apples does he have?",
]


@pytest.fixture(scope="module")
def sentinel() -> Sentinel:
    return Sentinel(OnnxModel(MODEL, "sentinel", RuntimeOptions(provider="cpu", intra_op_threads=1)))


def _threshold() -> float:
    return json.loads((MODEL / "truthlens.json").read_text())["provenance"]["recommended_threshold"]


def test_manifest_is_the_sentinel_contract():
    m = json.loads((MODEL / "truthlens.json").read_text())
    assert m["task"] == "sequence-classification"
    assert m["labels"] == ["non_factual", "factual"] and m["positive_label"] == "factual"
    assert m["provenance"]["parity"]["ok"]


def test_obvious_prompts_fall_on_the_right_side(sentinel):
    t = _threshold()
    p_fact = sentinel.predict_batch(FACTUAL)
    p_other = sentinel.predict_batch(NON_FACTUAL)
    assert all(p >= t for p in p_fact), list(zip(FACTUAL, p_fact))
    assert all(p < t for p in p_other), list(zip(NON_FACTUAL, p_other))


def test_batch_and_single_predictions_agree(sentinel):
    # int8 dynamic quantization scales activations per batch, so batch-mates move a
    # probability by ~1e-3; more than 1e-2 would mean padding leaks into the result.
    batch = sentinel.predict_batch(FACTUAL + NON_FACTUAL)
    single = [sentinel.predict_batch([p])[0] for p in FACTUAL + NON_FACTUAL]
    assert batch == pytest.approx(single, abs=1e-2)
