"""Bounded smoke version of `make models` for the detector: a tiny random BERT trains for a few
steps on a generated sample (loss goes down), exports to int8 ONNX, and the serving Detector
loads the directory and scores an answer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from extproc.inference.manifest import load_manifest  # noqa: E402
from extproc.inference.models import Detector, OnnxModel  # noqa: E402
from extproc.inference.runtime import RuntimeOptions  # noqa: E402
from models import shared  # noqa: E402
from models.pipelines.detector import data as detector_data, train  # noqa: E402
from models.pipelines.detector.features import Featurizer  # noqa: E402
from models.pipelines.hallucination.records import make_record, write_jsonl  # noqa: E402


def _toy(n: int, split: str) -> list[dict]:
    recs = []
    for i in range(n):
        ctx = f"The office of company {i} is in Delhi."
        answer = "The office is in Delhi."
        spans = []
        if i % 2:
            extra = "It employs 900 engineers in Paris."
            spans = [(len(answer) + 1, len(answer) + 1 + len(extra))]
            answer = f"{answer} {extra}"
        recs.append(make_record(f"{split}-{i}", [ctx], "Where is the office?", answer, spans, "qa", "toy", str(i)))
    return recs


@pytest.mark.slow
def test_train_export_load_predict(tmp_path: Path):
    data = tmp_path / "data"
    write_jsonl(data / "toy.train.jsonl", _toy(16, "train"))
    write_jsonl(data / "toy.dev.jsonl", _toy(6, "dev"))
    base = shared.tiny_bert_dir(tmp_path / "tiny")
    cfg = {
        "seed": 1, "threads": 1, "max_length": 64, "train_max_length": 64, "context_overlap": 8,
        "batch_size": 8, "lr": 3e-3, "warmup_ratio": 0.0, "epochs": 20, "max_steps": 30, "log_every": 5,
        "freeze_embeddings": False, "freeze_layers": 0,
        "train_mix": {"toy": "all"}, "dev_limit": {"toy": "all"}, "threshold_sources": ["toy"],
    }
    out = tmp_path / "detector"
    metrics = train.run(cfg, out, base, data_dir=data)

    losses = [loss for _, loss in metrics["train"]["loss_log"]]
    assert metrics["train"]["steps"] == 30 and len(losses) == 6
    assert losses[-1] < losses[0] * 0.7

    dev = metrics["dev"]["aggregations"]["max"]
    assert 0.05 <= dev["threshold"] <= 0.95
    assert dev["by_source"]["toy"]["n"] == 6
    assert json.loads((out / "metrics.json").read_text())["threshold"] == metrics["threshold"]
    # the per-threshold trade-off the card prints: the whole grid, F1 at the chosen threshold agrees with the
    # per-source metrics, faithful answers are counted
    sweep = dev["threshold_sweep"]
    assert len(sweep) == 19 and str(dev["threshold"]) in sweep
    assert sweep[str(dev["threshold"])]["f1"] == dev["by_source"]["toy"]["example_level"]["f1"]
    assert all(v["fp"] + v["tn"] == 3 for v in sweep.values())
    assert sweep["0.05"]["recall"] >= sweep["0.95"]["recall"]

    manifest = load_manifest(out)
    assert manifest.task == "token-classification"
    assert manifest.labels == ("supported", "hallucinated")
    assert manifest.provenance["recommended_token_threshold"] == metrics["threshold"]

    det = Detector(OnnxModel(out, "detector", RuntimeOptions(provider="cpu")))
    answer = "The office is in Delhi. It employs 900 engineers in Paris."
    scores = det.predict(["The office of company 3 is in Delhi."], "Where is the office?", answer)
    assert len(scores.probs) == len(scores.offsets) > 5
    assert ((scores.probs >= 0) & (scores.probs <= 1)).all()
    # the trained pattern survives export + int8: the added sentence scores above the grounded part
    cut = answer.index("It employs")
    head = [p for (s, _), p in zip(scores.offsets, scores.probs) if s < cut]
    tail = [p for (s, _), p in zip(scores.offsets, scores.probs) if s >= cut]
    assert sum(tail) / len(tail) > sum(head) / len(head)


def test_long_context_sources_get_longer_training_rows(tmp_path: Path):
    """train_max_length_by_source: a source whose evidence sits in a long context keeps more of it."""
    data = tmp_path / "data"
    filler = " ".join(f"Company {k} sells tea." for k in range(40))
    recs = [make_record(f"long-{i}", [filler, f"The office of company {i} is in Delhi."], "Where is the office?",
                        "The office is in Delhi.", [], "qa", "a", str(i)) for i in range(2)]
    write_jsonl(data / "a.train.jsonl", recs)
    write_jsonl(data / "b.train.jsonl", [{**r, "source": "b"} for r in recs])
    feat = Featurizer.from_file(str(shared.tiny_bert_dir(tmp_path / "tiny") / "tokenizer.json"), 8)
    cfg = {"train_mix": {"a": "all", "b": "all"}, "train_max_length": 48, "train_max_length_by_source": {"b": 160}}
    rows = detector_data.build_train(cfg, feat, data, random.Random(0))
    by_src = {src: [len(e.input_ids) for e in rows if e.meta["source"] == src] for src in ("a", "b")}
    assert max(by_src["a"]) <= 48 < min(by_src["b"]) <= 160
