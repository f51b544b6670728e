"""Sentinel training smoke test: a few steps on a tiny synthetic sample with a tiny random
BERT (same vocabulary as the base), then export and serve it through extproc.inference."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from extproc.inference.models import OnnxModel, Sentinel  # noqa: E402
from extproc.inference.runtime import RuntimeOptions  # noqa: E402
from models import shared  # noqa: E402
from models.pipelines.sentinel import card as card_module, data, evaluate, export, train  # noqa: E402

FACTUAL = ["who wrote {x}", "when was {x} born?", "what is the capital of {x}?", "how tall is {x}"]
OTHER = ["write a python function that sorts {x}", "compose a poem about {x}",
         "pretend you are {x} and say hi", "solve 3 + {n} * 2"]
WORDS = ["france", "lincoln", "the eiffel tower", "hamlet", "mars", "bach", "peru", "a cat"]


def _items(n: int, seed: int) -> list[data.Item]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        y = i % 2
        tmpl = rng.choice(FACTUAL if y else OTHER)
        out.append((tmpl.format(x=rng.choice(WORDS), n=rng.randint(1, 9)), y, "syn_f" if y else "syn_n"))
    return out


CFG = {
    "seed": 3, "max_length": 32, "threads": 1,
    "train": {"epochs": 6, "batch_size": 16, "lr": 3e-3, "weight_decay": 0.0, "warmup_ratio": 0.1, "log_every": 5},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tiny = shared.tiny_bert_dir(tmp_path_factory.mktemp("tiny"))
    out = tmp_path_factory.mktemp("sentinel")
    splits = {"train": _items(96, 0), "dev": _items(48, 1), "borderline": []}
    metrics = train.run(CFG, splits, out, tiny)
    metrics["export"] = export.export(CFG, out, metrics["threshold"])
    export.evaluate_served(out, splits, metrics)
    return out, metrics


def test_loss_decreases_and_dev_is_learned(trained):
    _, m = trained
    curve = m["train"]["loss_curve"]
    assert curve[-1] < curve[0]
    assert m["dev"]["accuracy"] >= 0.9
    assert sum(map(sum, m["dev"]["confusion_matrix"]["rows_gold_cols_pred"])) == 48
    assert set(m["dev"]["per_source"]) == {"syn_f", "syn_n"}


def test_served_int8_dev_metrics_replace_torch_ones(trained):
    out, m = trained
    assert m["dev"]["graph"].startswith("int8 ONNX")
    assert m["dev_torch_fp32"]["n"] == m["dev"]["n"] == 48
    assert abs(m["dev"]["accuracy"] - m["dev_torch_fp32"]["accuracy"]) <= 0.1
    assert json.loads((out / "truthlens.json").read_text())["provenance"]["recommended_threshold"] == m["threshold"]


def test_export_loads_and_predicts_through_serving_sentinel(trained):
    out, m = trained
    manifest = json.loads((out / "truthlens.json").read_text())
    assert manifest["labels"] == ["non_factual", "factual"] and manifest["positive_label"] == "factual"
    assert manifest["provenance"]["recommended_threshold"] == m["threshold"]
    assert m["export"]["ok"]
    sentinel = Sentinel(OnnxModel(out, "sentinel", RuntimeOptions(provider="cpu")))
    probs = sentinel.predict_batch(["what is the capital of peru?", "write a python function that sorts bach"])
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert probs[0] > m["threshold"] > probs[1]


def test_config_opts_into_per_channel_int8_export(trained, tmp_path):
    out, _ = trained
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "hf").symlink_to(out / "work" / "hf")
    report = export.export({**CFG, "export": {"per_channel": True}}, tmp_path, 0.5)
    assert report["ok"]
    assert json.loads((tmp_path / "truthlens.json").read_text())["provenance"]["per_channel"] is True
    assert "per_channel" not in json.loads((out / "truthlens.json").read_text())["provenance"]  # default unchanged
    p = Sentinel(OnnxModel(tmp_path, "sentinel", RuntimeOptions(provider="cpu"))).predict_batch(["who wrote hamlet"])
    assert 0.0 <= p[0] <= 1.0


def test_pick_threshold_maximises_balanced_accuracy():
    p = np.array([0.1, 0.2, 0.35, 0.4, 0.8, 0.9])
    y = np.array([0, 0, 0, 1, 1, 1])
    t = evaluate.pick_threshold(p, y)
    assert 0.35 < t <= 0.4


def test_augment_question_only_toggles_the_question_mark():
    rng = random.Random(0)
    outs = {data.augment_question("who wrote hamlet", rng, 0.5, 0.0) for _ in range(50)}
    assert outs == {"who wrote hamlet", "who wrote hamlet?"}
    outs = {data.augment_question("Who wrote Hamlet?", rng, 0.0, 0.5) for _ in range(50)}
    assert outs == {"Who wrote Hamlet", "Who wrote Hamlet?"}


def test_card_renders_dev_numbers_and_confusion_matrix(trained):
    _, m = trained
    card = card_module.sentinel_card(m)
    rows = m["dev"]["confusion_matrix"]["rows_gold_cols_pred"]
    assert f"| **non_factual** | {rows[0][0]} | {rows[0][1]} |" in card
    assert f"Accuracy **{m['dev']['accuracy']}**" in card
    assert "Trained on: **CPU**" in card
