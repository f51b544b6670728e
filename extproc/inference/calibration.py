"""Raw detector scores -> calibrated probabilities (Platt scaling on the score's logit).

A raw score (max token probability, noisy-OR, a fused sentence score) saturates near 1.0 and
means something different for every model, so a threshold in config would not carry across
models. `Calibration` maps it to P(hallucinated) fitted on human-labelled real-model answers:
`p = sigmoid(a * logit(raw) + b)` with a > 0, strictly increasing, so the ranking (AUROC) is
exactly the raw score's and only the scale changes. Two parameters fit well on a few hundred
labelled answers, where an isotonic fit would add flat steps that tie different answers.

With white-box signals (the surrogate LM's context PMI) the same logistic model gains one term
per signal: `p = sigmoid(a * logit(raw) + sum_k w_k * signal_k + b)`, logistic stacking fitted
on the same data. One file holds several fits, one per signal set (`fits`); the engine uses the
fit whose signals are all available, so a signal that is off or failed never biases the score:
the score falls back to the fit made without it.

The file (`calibration.json` in a detector directory) records what it calibrates and on which
data, so a calibration cannot silently be applied to another model's score.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

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
    signals: dict[str, float] = field(default_factory=dict)  # extra signal -> weight (on the signal's own scale)

    def __post_init__(self) -> None:
        weights = [self.b, *self.signals.values()]
        if not (math.isfinite(self.a) and all(math.isfinite(w) for w in weights)) or self.a <= 0:
            raise CalibrationError(f"calibration needs a finite slope a > 0 and finite weights, got a={self.a}, "
                                   f"b={self.b}, signals={self.signals}")

    def __call__(self, raw: float, signals: Mapping[str, float] | None = None) -> float:
        z = self.a * float(_logit(raw)) + self.b
        for name, weight in self.signals.items():
            if signals is None or name not in signals:
                raise CalibrationError(f"this calibration needs the {name!r} signal")
            z += weight * float(signals[name])
        return float(1.0 / (1.0 + math.exp(-z)))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: str | Path) -> Path:
        """This fit alone as the directory's calibration.json."""
        return CalibrationSet((self,)).save(directory)

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Calibration":
        if not isinstance(data, dict):
            raise CalibrationError(f"{where}: expected a JSON object")
        try:
            return cls(float(data["a"]), float(data["b"]), str(data["raw_score"]),
                       {str(k): str(v) for k, v in (data.get("models") or {}).items()},
                       dict(data.get("fitted_on") or {}),
                       {str(k): float(v) for k, v in (data.get("signals") or {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: {exc}") from exc


@dataclass(frozen=True)
class CalibrationSet:
    """The fits of one detector directory's `calibration.json`, one per signal set."""

    fits: tuple[Calibration, ...]

    def for_signals(self, available: set[str] | frozenset[str], raw_score: str) -> Calibration | None:
        """The fit for `raw_score` that uses the most signals, all of them available."""
        usable = [c for c in self.fits if c.raw_score == raw_score and set(c.signals) <= set(available)]
        return max(usable, key=lambda c: len(c.signals), default=None)

    def save(self, directory: str | Path) -> Path:
        """As a detector directory's calibration.json."""
        return self.write(Path(directory) / CALIBRATION_FILE)

    def write(self, path: str | Path) -> Path:
        data = self.fits[0].to_json() if len(self.fits) == 1 else {"fits": [c.to_json() for c in self.fits]}
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationSet":
        """A single fit (an object with `a`, `b`, ...) or several (`{"fits": [...]}`)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CalibrationError(f"{path}: not a readable calibration file ({exc})") from exc
        if isinstance(data, dict) and "fits" in data:
            if not isinstance(data["fits"], list) or not data["fits"]:
                raise CalibrationError(f"{path}: `fits` must be a non-empty list")
            return cls(tuple(Calibration.from_json(f, f"{path} fits[{i}]") for i, f in enumerate(data["fits"])))
        return cls((Calibration.from_json(data, str(path)),))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_models(cal: Calibration, model_files: dict[str, Path], where: str,
                 digests: Mapping[str, str] | None = None) -> None:
    """The calibration must have been fitted with exactly these model files (a retrained model
    shifts its scores, and a stale calibration would turn them into wrong probabilities).
    `digests`: roles whose identity is a recorded sha256 rather than a file to hash (the surrogate
    LM: the GGUF its graph was built from, recorded in its manifest)."""
    for role, sha in cal.models.items():
        if digests and role in digests:
            if digests[role] != sha:
                raise CalibrationError(f"{where}: fitted for another {role} model (its sha256 differs); "
                                       "refit it (python -m bench.real_output_suite --fit-calibration) or remove the file")
            continue
        path = model_files.get(role)
        if path is None:
            raise CalibrationError(f"{where}: fitted with a {role} model, which is not loaded")
        if file_sha256(path) != sha:
            raise CalibrationError(f"{where}: fitted for another {role} model ({path} has a different sha256); "
                                   "refit it (python -m bench.real_output_suite --fit-calibration) or remove the file")


def fit_platt(raw: Sequence[float], labels: Sequence[bool], raw_score: str, l2: float = 1e-3,
              signals: Mapping[str, Sequence[float]] | None = None, **meta: Any) -> Calibration:
    """Logistic regression of the label on logit(raw) and any extra signals (Newton steps, tiny L2
    for separable data). With no signals this is Platt scaling; with them, logistic stacking."""
    x = _logit(np.asarray(raw, dtype=np.float64))
    y = np.asarray(labels, dtype=np.float64)
    if x.shape != y.shape or y.size < 2 or y.min() == y.max():
        raise CalibrationError("calibration needs scores and labels of both classes, one per example")
    names = list(signals or {})
    extra = [np.asarray(signals[n], dtype=np.float64) for n in names] if signals else []
    if any(e.shape != x.shape or not np.all(np.isfinite(e)) for e in extra):
        raise CalibrationError(f"every signal needs one finite value per example ({names})")
    design = np.stack([x, *extra, np.ones_like(x)], axis=1)
    w = np.zeros(design.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ w)))
        grad = design.T @ (p - y) + l2 * w
        hess = design.T @ (design * (p * (1 - p))[:, None]) + l2 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    if w[0] <= 0:
        raise CalibrationError(f"the raw score {raw_score!r} does not rise with the label on this data (slope {w[0]:.3g})")
    return Calibration(float(w[0]), float(w[-1]), raw_score, signals={n: float(v) for n, v in zip(names, w[1:-1])},
                       **meta)
