"""Sentinel export: work/hf -> int8 ONNX model directory, then dev metrics from that served graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from models import shared
from models.pipelines.sentinel.data import LABELS, Item
from models.pipelines.sentinel.evaluate import pick_threshold, report


def export(cfg: dict[str, Any], out_dir: Path, threshold: float) -> dict[str, Any]:
    """work/hf -> int8 ONNX model directory in out_dir; returns the parity report + seconds."""
    with shared.timed() as t_export:
        parity = shared.export_classifier(
            out_dir / "work" / "hf", "sentinel", out_dir, LABELS, cfg["max_length"],
            threshold=threshold, per_channel=bool((cfg.get("export") or {}).get("per_channel")),
            provenance={"base_model": shared.BASE_MODEL_NAME, "seed": cfg["seed"],
                        "config": "models/sentinel/train.yaml"})
    per_channel = {"per_channel": True} if (cfg.get("export") or {}).get("per_channel") else {}
    return {"seconds": t_export["seconds"], **per_channel,
            **{k: v for k, v in parity.items() if "diff" in k or k == "ok"}}


def evaluate_served(out_dir: Path, splits: dict[str, list[Item]], metrics: dict[str, Any]) -> None:
    """Dev metrics from the exported int8 graph through the serving wrapper (what users get).

    The threshold is re-picked on these probabilities (int8 shifts logits) and written into
    the manifest; the fp32 torch numbers stay in metrics as `dev_torch_fp32`.
    """
    from extproc.inference.models import OnnxModel, Sentinel
    from extproc.inference.runtime import RuntimeOptions

    served = Sentinel(OnnxModel(out_dir, "sentinel", RuntimeOptions(provider="cpu", intra_op_threads=1)))
    if "dev" in metrics and "dev_torch_fp32" not in metrics:
        metrics["dev_torch_fp32"] = metrics.pop("dev")
        metrics["threshold_torch_fp32"] = metrics["threshold"]
    p = np.array(served.predict_batch([t for t, _, _ in splits["dev"]]))
    thr = pick_threshold(p, np.array([y for _, y, _ in splits["dev"]]))
    metrics["threshold"] = thr
    metrics["dev_at_0.5"] = report(splits["dev"], p, 0.5)
    metrics["dev"] = report(splits["dev"], p, thr)
    metrics["dev"]["graph"] = "int8 ONNX via extproc.inference.Sentinel"
    if splits.get("borderline"):
        pb = np.array(served.predict_batch([t for t, _, _ in splits["borderline"]]))
        metrics["borderline"] = report(splits["borderline"], pb, thr)
    shared.set_recommended_threshold(out_dir, thr)
