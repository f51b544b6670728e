"""Glue between training and the inference layer: input templates and ONNX export.

Training must build inputs with the same functions the gateway uses at serving time, and
export through the inference layer's exporter so the manifest is what the loader expects.
"""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any, Sequence

try:  # the serving templates, when the inference layer provides them
    from extproc.inference import templates as _templates
except ImportError:  # pragma: no cover - only before the inference layer landed
    _templates = None


def sentinel_input(prompt: str, system: str | None = None) -> str:
    """The sentinel's input text for one prompt, exactly as the gateway builds it."""
    if _templates is not None and hasattr(_templates, "sentinel_text"):
        return _templates.sentinel_text(prompt, system)
    return prompt if not system else f"{system}\n\n{prompt}"


def nli_input(premise: str, hypothesis: str) -> tuple[str, str]:
    """The explainer's (premise, hypothesis) pair, exactly as the gateway builds it."""
    if _templates is not None and hasattr(_templates, "nli_pair"):
        return _templates.nli_pair(premise, hypothesis)
    return premise, hypothesis


def export_classifier(
    hf_dir: Path, role: str, out_dir: Path, labels: Sequence[str], max_length: int,
    threshold: float | None = None, provenance: dict[str, Any] | None = None, per_channel: bool = False,
) -> dict[str, Any]:
    """int8 ONNX + tokenizer + manifest in the inference layer's model-directory format.

    `per_channel` opts into per-output-channel int8 weight scales (closer to fp32).
    Returns the exporter's parity report (max |onnx - torch| logit difference).
    """
    from extproc.inference.export import export_model

    prov = dict(provenance or {})
    if threshold is not None:
        prov["recommended_threshold"] = threshold
    return export_model(
        str(hf_dir), role, str(out_dir), quantize="int8", labels=list(labels), max_length=max_length,
        provenance=prov, positive_label="factual" if role == "sentinel" else None, name=role,
        per_channel=per_channel,
    )


def set_recommended_threshold(out_dir: Path, threshold: float) -> None:
    """Record the operating point chosen on the served graph in the manifest's provenance."""
    path = Path(out_dir) / "truthlens.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["provenance"]["recommended_threshold"] = threshold
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
