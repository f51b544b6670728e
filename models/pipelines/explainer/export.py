"""Explainer export: work/hf -> int8 ONNX model directory, then held-out metrics from that served graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from extproc.inference.templates import nli_pair
from models import shared
from models.pipelines.explainer.data import LABELS, Item
from models.pipelines.explainer.evaluate import entailment_threshold, report


def export(cfg: dict[str, Any], out_dir: Path, metrics: dict[str, Any],
           config_path: str = "models/explainer/train.yaml") -> dict[str, Any]:
    with shared.timed() as t_export:
        parity = shared.export_classifier(
            out_dir / "work" / "hf", "explainer", out_dir, list(LABELS), cfg["max_length"],
            threshold=(metrics.get("nli_entailment") or {}).get("threshold"),
            provenance={"base_model": shared.BASE_MODEL_NAME, "seed": cfg["seed"], "config": config_path,
                        **({"init_from": cfg["init_from"]} if cfg.get("init_from") else {})})
    return {"seconds": t_export["seconds"], **{k: v for k, v in parity.items() if "diff" in k or k == "ok"}}


def evaluate_served(out_dir: Path, cfg: dict[str, Any], items: Sequence[Item], metrics: dict[str, Any]) -> None:
    """Held-out metrics from the exported int8 graph through the serving Explainer (what users get).

    Probabilities per pair are the per-class max over premise windows (one window for almost
    every pair at max_length 128); the label is the Explainer's own window aggregation.
    """
    from extproc.inference.models import Explainer, OnnxModel
    from extproc.inference.runtime import RuntimeOptions

    explainer = Explainer(OnnxModel(out_dir, "explainer", RuntimeOptions(provider="cpu", intra_op_threads=1)))
    probs = np.zeros((len(items), len(LABELS)), dtype=np.float32)
    for i, (p, h, _, _) in enumerate(items):
        prem, hyp = nli_pair(p, h)
        prepared = explainer.prepare([prem], [hyp])
        rows = explainer.model.infer(prepared[0].rows)
        probs[i] = np.max(np.stack(rows), axis=0)
    if "test" in metrics and "test_torch_fp32" not in metrics:
        metrics["test_torch_fp32"] = metrics.pop("test")
        metrics["nli_entailment_torch_fp32"] = metrics.pop("nli_entailment", None)
    two_way = cfg["data"].get("two_way", [])
    metrics["test"] = report(items, probs, two_way)
    metrics["test"]["graph"] = "int8 ONNX via extproc.inference.Explainer"
    three = [i for i, it in enumerate(items) if it[3] not in two_way]
    metrics["nli_entailment"] = entailment_threshold([items[i] for i in three], probs[three],
                                                     cfg.get("entailment_precision", 0.9))
    shared.set_recommended_threshold(out_dir, metrics["nli_entailment"]["threshold"])
