"""Detector export: work/hf -> int8 ONNX model directory, then dev metrics and the token threshold
from that served graph (recorded in the manifest and metrics.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models import shared
from models.pipelines.detector.evaluate import evaluate, onnx_scorer
from models.pipelines.detector.features import LABELS, TEMPLATE, Featurizer


def export(cfg: dict[str, Any], out_dir: Path, metrics: dict[str, Any],
           config_path: str = "models/detector/train.yaml") -> None:
    """work/hf -> int8 ONNX in out_dir; the exporter's report and the graph's size go into metrics."""
    from extproc.inference.export import export_model

    work = out_dir / "work"
    with shared.timed() as t_exp:
        rep = export_model(str(work / "hf"), "token-classification", str(out_dir), quantize="int8",
                           optimize=bool((cfg.get("export") or {}).get("optimize")),
                           labels=LABELS, template=TEMPLATE, max_length=cfg["max_length"],
                           context_overlap=cfg.get("context_overlap", 64),
                           provenance={"base_model": shared.BASE_MODEL_NAME, "seed": cfg["seed"],
                                       "train_config": config_path})
    metrics["export"] = {"seconds": t_exp["seconds"], **{k: v for k, v in rep.items() if k != "out_dir"}}
    metrics["size_bytes"] = (out_dir / "model.onnx").stat().st_size


def evaluate_export(cfg: dict[str, Any], out_dir: Path, metrics: dict[str, Any], feat: Featurizer,
                    dev: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Dev metrics from the int8 graph the gateway serves (also ~2x cheaper than torch on CPU);
    the chosen threshold goes into the manifest and metrics.json."""
    metrics["dev"] = evaluate(onnx_scorer(out_dir, cfg.get("threads") or 2), feat, dev, cfg)
    metrics["dev"]["model"] = "int8 onnx (serving graph)"
    metrics["threshold"] = metrics["dev"]["aggregations"]["min"]["threshold"]  # the runtime's rule (aggregate_windows)
    record_threshold(out_dir, metrics["threshold"])
    shared.write_json(out_dir / "metrics.json", metrics)
    return metrics


def record_threshold(out_dir: Path, threshold: float) -> None:
    """Store the dev-chosen token threshold in the manifest's provenance (the card repeats it)."""
    from extproc.inference.manifest import load_manifest

    m = load_manifest(out_dir)
    data = m.to_json()
    data["provenance"] = {**data["provenance"], "recommended_token_threshold": threshold}
    (out_dir / "truthlens.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
