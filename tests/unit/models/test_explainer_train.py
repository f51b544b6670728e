"""Explainer training smoke test: a few steps of 3-way NLI on a tiny synthetic sample with a
tiny random BERT, then export and serve it through extproc.inference's Explainer."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from extproc.inference.models import Explainer, OnnxModel  # noqa: E402
from extproc.inference.runtime import RuntimeOptions  # noqa: E402
from models import shared  # noqa: E402
from models.pipelines.explainer import card as card_module, data, evaluate, export, train  # noqa: E402

SUBJ = ["a man", "a woman", "the dog", "two kids"]
VERB = ["runs", "sleeps", "eats", "sings"]


def _items(n: int, seed: int) -> list[data.Item]:
    """Lexically separable toy NLI (a tiny random encoder learns it in a few dozen steps)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s, v = rng.choice(SUBJ), rng.choice(VERB)
        prem = f"{s} {v} outside"
        y = i % 3
        hyp = {0: f"{s} is outside", 1: f"{rng.choice(SUBJ)} owns a blue car", 2: "nobody is here at all"}[y]
        out.append((prem, hyp, y, "syn_a" if i % 2 else "syn_b"))
    return out


CFG = {
    "seed": 5, "max_length": 32, "threads": 1, "entailment_precision": 0.9,
    "train": {"epochs": 30, "batch_size": 16, "lr": 1e-3, "weight_decay": 0.0, "warmup_ratio": 0.1, "log_every": 5},
    "data": {"two_way": ["syn_b"]},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tiny = shared.tiny_bert_dir(tmp_path_factory.mktemp("tiny"))
    out = tmp_path_factory.mktemp("explainer")
    test = _items(60, 1)
    metrics = train.run(CFG, {"train": _items(96, 0), "test": test}, out, tiny)
    metrics["export"] = export.export(CFG, out, metrics)
    export.evaluate_served(out, CFG, test, metrics)
    return out, metrics


def test_loss_decreases_and_per_source_accuracy_is_reported(trained):
    _, m = trained
    curve = m["train"]["loss_curve"]
    assert curve[-1] < curve[0]
    assert m["test"]["accuracy"] >= 0.8
    assert set(m["test"]["per_source"]) == {"syn_a", "syn_b"}
    assert "accuracy_2way" in m["test"]["per_source"]["syn_b"]
    assert "accuracy_2way" not in m["test"]["per_source"]["syn_a"]


def test_served_int8_metrics_replace_torch_ones(trained):
    out, m = trained
    assert m["test"]["graph"].startswith("int8 ONNX")
    assert m["test_torch_fp32"]["n"] == m["test"]["n"] == 60
    assert abs(m["test"]["accuracy"] - m["test_torch_fp32"]["accuracy"]) <= 0.1
    threshold = json.loads((out / "truthlens.json").read_text())["provenance"]["recommended_threshold"]
    assert threshold == m["nli_entailment"]["threshold"]


def test_export_loads_and_predicts_through_serving_explainer(trained):
    out, m = trained
    manifest = json.loads((out / "truthlens.json").read_text())
    assert manifest["task"] == "nli" and manifest["labels"] == ["entailment", "neutral", "contradiction"]
    assert m["export"]["ok"]
    explainer = Explainer(OnnxModel(out, "explainer", RuntimeOptions(provider="cpu")))
    res = explainer.predict_batch(["the dog sleeps outside"], ["the dog is outside", "nobody is here at all"])
    assert [r.label for r in res] == ["entailment", "contradiction"]
    assert 0.0 <= res[1].entailment < res[0].entailment <= 1.0


def test_two_way_accuracy_ignores_the_neutral_column():
    items = [("p", "h", 0, "fever"), ("p", "h", 2, "fever")]
    probs = np.array([[0.3, 0.6, 0.1], [0.1, 0.6, 0.3]])  # neutral wins 3-way, 2-way is right
    rep = evaluate.report(items, probs, ["fever"])
    assert rep["per_source"]["fever"] == {"n": 2, "accuracy": 0.0, "accuracy_2way": 1.0}


def test_entailment_threshold_reaches_the_precision_target():
    rng = np.random.default_rng(0)
    y = np.array([0] * 100 + [1] * 100)
    pe = np.concatenate([rng.uniform(0.6, 1.0, 100), rng.uniform(0.0, 0.8, 100)])
    probs = np.stack([pe, (1 - pe) / 2, (1 - pe) / 2], axis=1)
    items = [("p", "h", int(v), "s") for v in y]
    got = evaluate.entailment_threshold(items, probs, 0.95)
    sel = pe >= got["threshold"]
    assert np.mean(y[sel] == 0) >= 0.95
    assert got["precision"] >= 0.95


def test_card_renders_per_source_accuracy(trained):
    _, m = trained
    card = card_module.explainer_card(m)
    for src, v in m["test"]["per_source"].items():
        assert f"| {src} |" in card and str(v["accuracy"]) in card
    assert "Confusion matrix" in card
