"""Prefilter training on a small synthetic sample: it learns, its band report is honest,
and the cascade report counts what the prefilter decided and what it left to the model."""

from __future__ import annotations

import random

import numpy as np

from extproc.inference.prefilter import LexicalPrefilter, PrefilterBand
from models.pipelines.sentinel.prefilter import band_report, cascade_report, cross_validate, featurize, fit, vocabulary

FACTUAL = ["who wrote {x}", "when was {x} born?", "what is the capital of {x}?", "how tall is {x}"]
OTHER = ["write a python function that sorts {x}", "compose a poem about {x}", "pretend you are {x} and say hi"]
WORDS = ["france", "lincoln", "the eiffel tower", "hamlet", "mars", "bach", "peru", "a cat"]
CFG = {"min_count": 1, "epochs": 3, "lr": 0.3, "l2": 1e-4}


def _items(n: int, seed: int) -> list[tuple[str, int, str]]:
    rng = random.Random(seed)
    return [(rng.choice(FACTUAL if i % 2 else OTHER).format(x=rng.choice(WORDS)), i % 2, "syn") for i in range(n)]


def test_fit_learns_and_the_saved_prefilter_serves_the_same_scores(tmp_path):
    train, dev = _items(200, 0), _items(60, 1)
    texts = [t for t, _, _ in train]
    vocab = vocabulary(texts, CFG["min_count"])
    assert vocab == sorted(set(vocab)) and "who wrote" in vocab and "^^write a" in vocab
    assert len(vocabulary(texts, 50)) < len(vocab)  # rarer features drop out
    y = np.array([lab for _, lab, _ in train], dtype=float)
    w, b = fit(featurize(texts, vocab), y, len(vocab), CFG["epochs"], CFG["lr"], CFG["l2"], seed=0)
    band = PrefilterBand(0.1, 0.9)
    pre = LexicalPrefilter.from_vocabulary(vocab, w, b, band, {})
    pre.save(tmp_path)
    served = LexicalPrefilter.load(tmp_path)
    p = np.array([served.probability(t) for t, _, _ in dev])
    y_dev = np.array([lab for _, lab, _ in dev])
    assert np.mean((p >= 0.5) == y_dev) >= 0.95
    rep = band_report(p, y_dev, band)
    assert rep["coverage"] > 0.5 and rep["precision"] >= 0.95
    cv = cross_validate(texts, y, CFG, band, seed=0, folds=3)
    assert cv["n"] == 200 and cv["accuracy_at_0.5"] >= 0.9


def test_cascade_report_uses_the_model_only_inside_the_band():
    items = [("a", 1, "s"), ("b", 0, "s"), ("c", 1, "s"), ("d", 0, "s")]
    p_lex = np.array([0.99, 0.01, 0.5, 0.5])  # two decided (both right), two deferred
    p_model = np.array([0.0, 1.0, 0.9, 0.1])  # the model is wrong where the prefilter decided
    rep = cascade_report(items, p_lex, p_model, threshold=0.5, band=PrefilterBand(0.05, 0.95))
    assert rep["accuracy"] == 1.0 and rep["model_only_accuracy"] == 0.5
    assert rep["band"]["coverage"] == 0.5 and rep["band"]["precision"] == 1.0
    assert rep["per_source"]["s"] == {"n": 4, "accuracy": 1.0, "coverage": 0.5}
