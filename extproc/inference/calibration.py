"""Raw detector scores -> calibrated probabilities (Platt scaling on the score's logit).

A raw score (max token probability, noisy-OR, a fused sentence score) saturates near 1.0 and
means something different for every model, so a threshold in config would not carry across
models. `Calibration` maps it to P(hallucinated) fitted on human-labelled real-model answers:
`p = sigmoid(a * logit(raw) + b)` with a > 0, strictly increasing, so the ranking (AUROC) is
exactly the raw score's and only the scale changes. Two parameters fit well on a few hundred
labelled answers, where an isotonic fit would add flat steps that tie different answers.

The file (`calibration.json` in a detector directory) records what it calibrates and on which
data, so a calibration cannot silently be applied to another model's score.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

CALIBRATION_FILE = "calibration.json"
EPS = 1e-6


class CalibrationError(ValueError):
    """A calibration file or fit that cannot be used; the message names what is wrong."""


def _logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.log(q / (1.0 - q))


@dataclass(frozen=True)
class Calibration:
    a: float
    b: float
    raw_score: str  # which raw score this maps: a `truthlens.score_method`
    models: dict[str, str] = field(default_factory=dict)  # role -> sha256 of the model.onnx it was fitted with
    fitted_on: dict[str, Any] = field(default_factory=dict)  # sets, counts, command

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)) or self.a <= 0:
            raise CalibrationError(f"calibration needs a finite slope a > 0 and a finite b, got a={self.a}, b={self.b}")

    def __call__(self, raw: float) -> float:
        return float(1.0 / (1.0 + np.exp(-(self.a * _logit(raw) + self.b))))

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CALIBRATION_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CalibrationError(f"{path}: not a readable calibration file ({exc})") from exc
        if not isinstance(data, dict):
            raise CalibrationError(f"{path}: expected a JSON object")
        try:
            return cls(float(data["a"]), float(data["b"]), str(data["raw_score"]),
                       {str(k): str(v) for k, v in (data.get("models") or {}).items()},
                       dict(data.get("fitted_on") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{path}: {exc}") from exc


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_models(cal: Calibration, model_files: dict[str, Path], where: str) -> None:
    """The calibration must have been fitted with exactly these model files (a retrained model
    shifts its scores, and a stale calibration would turn them into wrong probabilities)."""
    for role, sha in cal.models.items():
        path = model_files.get(role)
        if path is None:
            raise CalibrationError(f"{where}: fitted with a {role} model, which is not loaded")
        if file_sha256(path) != sha:
            raise CalibrationError(f"{where}: fitted for another {role} model ({path} has a different sha256); "
                                   "refit it (bench/real_output_suite.py --fit-calibration) or remove the file")


def fit_platt(raw: Sequence[float], labels: Sequence[bool], raw_score: str, l2: float = 1e-3,
              **meta: Any) -> Calibration:
    """Logistic regression of the label on logit(raw) (Newton steps, tiny L2 for separable data)."""
    x = _logit(np.asarray(raw, dtype=np.float64))
    y = np.asarray(labels, dtype=np.float64)
    if x.shape != y.shape or y.size < 2 or y.min() == y.max():
        raise CalibrationError("calibration needs scores and labels of both classes, one per example")
    w = np.zeros(2)
    design = np.stack([x, np.ones_like(x)], axis=1)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ w)))
        grad = design.T @ (p - y) + l2 * w
        hess = design.T @ (design * (p * (1 - p))[:, None]) + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    if w[0] <= 0:
        raise CalibrationError(f"the raw score {raw_score!r} does not rise with the label on this data (slope {w[0]:.3g})")
    return Calibration(float(w[0]), float(w[1]), raw_score, **meta)
