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


def test_identical_rows_in_a_batch_match_the_single_run(sentinel):
    # Same rows -> same activation range -> the same int8 scales: batching itself adds nothing.
    prompt = NON_FACTUAL[0]
    single = sentinel.predict_batch([prompt])[0]
    assert sentinel.predict_batch([prompt] * 3) == pytest.approx([single] * 3, abs=1e-6)


def test_batch_mates_do_not_flip_clear_prompts(sentinel):
    # int8 dynamic quantization scales activations over the whole batch, so other prompts in
    # the batch move a probability (dev pairs: mean 0.003-0.005, p99 0.07-0.13; bench/results/sentinel-batching.md).
    # Clear prompts must keep their side of the threshold, and stay within 0.1 of the single run.
    t = _threshold()
    prompts = FACTUAL + NON_FACTUAL
    batch = sentinel.predict_batch(prompts)
    single = [sentinel.predict_batch([p])[0] for p in prompts]
    assert [p >= t for p in batch] == [p >= t for p in single], list(zip(prompts, batch, single))
    assert batch == pytest.approx(single, abs=0.1)
