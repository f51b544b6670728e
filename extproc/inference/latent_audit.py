"""LatentAudit: how far an answer's hidden states sit from those of faithful answers.

The surrogate LM's grounded pass gives, per exported layer, the mean hidden state over the
answer tokens and over the passage tokens; their difference (answer relative to its evidence)
is the feature vector. A projector maps it to a few dimensions (the ridge direction that
separates the classes on the calibration data, plus the main directions of variation), a
Ledoit-Wolf covariance of the *faithful* answers' projections defines the Mahalanobis distance,
and Youden's J on the calibration split picks the threshold. The whole scorer is one affine map
followed by a sum of squares, so it also runs in 16-bit fixed point (int16 weights and inputs,
int64 accumulators, an integer rescale): `FixedPointAudit`, whose decisions are measured
against float by `truthlens calibrate`.

`truthlens calibrate --data FILE.jsonl --out calibration.npz` fits it; the file records the
surrogate's GGUF sha256 and is refused for another model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

FORMAT_VERSION = 1
INT16_MAX = 32767
MULTIPLIER_BITS = 24  # integer rescale per output row: y = (acc * multiplier) >> shift, multiplier in [2^23, 2^24)


class AuditError(ValueError):
    """A LatentAudit file or fit that cannot be used; the message names what is wrong."""


def audit_features(hidden: np.ndarray) -> np.ndarray:
    """[layers, 2, H] (answer mean, passage mean) -> answer minus evidence, layers concatenated."""
    h = np.asarray(hidden, dtype=np.float64)
    if h.ndim != 3 or h.shape[1] != 2:
        raise AuditError(f"hidden states must be [layers, 2, hidden], got {h.shape}")
    return (h[:, 0] - h[:, 1]).reshape(-1)


def ledoit_wolf(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Ledoit-Wolf (2004) shrinkage covariance toward mu*I: (covariance, shrinkage in [0, 1])."""
    x = np.asarray(x, dtype=np.float64)
    n, p = x.shape
    if n < 2:
        raise AuditError("a covariance needs at least two samples")
    xc = x - x.mean(axis=0)
    s = xc.T @ xc / n
    mu = np.trace(s) / p
    delta = float(((s - mu * np.eye(p)) ** 2).sum()) / p  # distance of S to the target
    x2 = xc ** 2
    beta = float((x2.T @ x2).sum() / n - (s ** 2).sum()) / (n * p)  # variance of S's entries around it
    shrink = 0.0 if delta == 0 else min(max(beta, 0.0), delta) / delta
    return (1 - shrink) * s + shrink * mu * np.eye(p), shrink


def youden_threshold(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The cut maximising TPR - FPR (flag when score >= cut), placed halfway between the lowest flagged
    score and the next lower one: no calibration answer sits exactly on it (ties keep the lower cut)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if y.all() or not y.any():
        raise AuditError("Youden's J needs both classes")
    values = np.unique(s)
    best, at = -np.inf, 0
    for i, t in enumerate(values):
        j = (s[y] >= t).mean() - (s[~y] >= t).mean()
        if j > best:
            best, at = j, i
    return float((values[at] + values[at - 1]) / 2) if at > 0 else float(values[0] - 1e-9)


@dataclass(frozen=True)
class LatentAudit:
    """Affine map + sum of squares: distance(x) = sqrt(|matrix @ x + offset|^2)."""

    matrix: np.ndarray  # [k, d]: standardisation, projector and whitening folded together
    offset: np.ndarray  # [k]
    threshold: float  # distance at or above which an answer is flagged (Youden's J)
    model_sha256: str  # the surrogate's GGUF
    layers: tuple[int, ...]
    fitted_on: dict[str, Any] = field(default_factory=dict)

    def distance(self, x: np.ndarray) -> float:
        y = self.matrix @ np.asarray(x, dtype=np.float64) + self.offset
        return float(np.sqrt(y @ y))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        meta = {"format_version": FORMAT_VERSION, "threshold": self.threshold, "model_sha256": self.model_sha256,
                "layers": list(self.layers), "fitted_on": self.fitted_on}
        with open(path, "wb") as fh:  # np.savez would add .npz to a name without it
            np.savez(fh, matrix=self.matrix, offset=self.offset, meta=np.array(json.dumps(meta)))
        return path

    @classmethod
    def load(cls, path: str | Path, model_sha256: str | None = None) -> "LatentAudit":
        """Refuses a file made for another surrogate (when `model_sha256` is given)."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                audit = cls(np.asarray(data["matrix"], dtype=np.float64), np.asarray(data["offset"], dtype=np.float64),
                            float(meta["threshold"]), str(meta["model_sha256"]), tuple(int(x) for x in meta["layers"]),
                            dict(meta.get("fitted_on") or {}))
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise AuditError(f"{path}: not a LatentAudit calibration file ({exc})") from exc
        if audit.matrix.ndim != 2 or audit.offset.shape != (audit.matrix.shape[0],):
            raise AuditError(f"{path}: matrix {audit.matrix.shape} and offset {audit.offset.shape} disagree")
        if model_sha256 is not None and audit.model_sha256 != model_sha256:
            raise AuditError(f"{path}: made for another surrogate model (GGUF sha256 {audit.model_sha256[:12]}…, "
                             f"loaded {model_sha256[:12]}…); refit it with truthlens calibrate")
        return audit


def fit_latent_audit(x: np.ndarray, labels: Sequence[bool], *, model_sha256: str, layers: Sequence[int], k: int = 4,
                     ridge: float = 1.0, threshold_split: float = 0.5, seed: int = 0,
                     **meta: Any) -> LatentAudit:
    """Fit projector and faithful-class covariance on one part of the data, Youden's threshold on the other."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n, d = x.shape
    if y.shape != (n,) or y.all() or not y.any():
        raise AuditError("LatentAudit needs one label per row and both classes")
    order = np.random.default_rng(seed).permutation(n)
    cut = int(n * (1 - threshold_split))
    fit_idx, thr_idx = order[:cut], order[cut:]
    if not (y[fit_idx].any() and (~y[fit_idx]).any() and y[thr_idx].any() and (~y[thr_idx]).any()):
        raise AuditError("both splits need both classes: more data")
    xf, yf = x[fit_idx], y[fit_idx]
    mean, std = xf.mean(axis=0), xf.std(axis=0) + 1e-6
    z = (xf - mean) / std
    # the ridge direction separating the classes, then the main directions of variation orthogonal to it
    target = yf.astype(np.float64) - yf.mean()
    w = np.linalg.solve(z.T @ z + ridge * len(z) * np.eye(d), z.T @ target) if d <= 4096 else \
        z.T @ np.linalg.solve(z @ z.T + ridge * len(z) * np.eye(len(z)), target)
    w /= np.linalg.norm(w) + 1e-12
    rest = z - np.outer(z @ w, w)
    _, _, vt = np.linalg.svd(rest, full_matrices=False)
    projector = np.vstack([w, vt[: max(k - 1, 0)]])  # [k, d]
    faithful = z[~yf] @ projector.T
    cov, shrink = ledoit_wolf(faithful)
    whiten = np.linalg.cholesky(np.linalg.inv(cov)).T  # whiten.T @ whiten = cov^-1
    matrix = whiten @ projector / std
    offset = -whiten @ (projector @ (mean / std) + faithful.mean(axis=0))
    audit = LatentAudit(matrix, offset, 0.0, model_sha256, tuple(layers))
    scores = [audit.distance(v) for v in x[thr_idx]]
    threshold = youden_threshold(scores, y[thr_idx])
    return LatentAudit(matrix, offset, threshold, model_sha256, tuple(layers),
                       {**meta, "k": int(projector.shape[0]), "ridge": ridge, "ledoit_wolf_shrinkage": shrink,
                        "fit_rows": int(cut), "threshold_rows": int(n - cut)})


@dataclass(frozen=True)
class FixedPointAudit:
    """The same scorer in 16-bit fixed point: int16 weights and inputs, integer accumulation, and an
    integer rescale per output row (24-bit multiplier and a shift); the sum of squares is compared
    with the squared threshold in integers."""

    weights: np.ndarray  # int16 [k, d], in units of the quantized inputs
    multipliers: tuple[int, ...]  # per row, (row scale / output scale) * 2^shift
    shifts: tuple[int, ...]
    offset: tuple[int, ...]  # per row, in output units
    input_scales: np.ndarray  # [d]: one step of each quantized input (hidden-state features differ by 100x in range)
    threshold_sq: int  # threshold^2 in output units^2

    @classmethod
    def from_float(cls, audit: LatentAudit, input_range: np.ndarray | float) -> "FixedPointAudit":
        """`input_range`: per feature (or for all), the largest |value| to represent; larger inputs saturate."""
        ranges = np.broadcast_to(np.asarray(input_range, dtype=np.float64), (audit.matrix.shape[1],))
        input_scales = np.where(ranges > 0, ranges, 1.0) / INT16_MAX
        folded = audit.matrix * input_scales[None, :]  # the weights see quantized inputs
        row_scale = np.abs(folded).max(axis=1) / INT16_MAX
        row_scale[row_scale == 0] = 1.0
        weights = np.round(folded / row_scale[:, None]).astype(np.int16)
        out_scale = max(audit.threshold, 1e-6) / 4096  # the threshold spans 12 bits of the output
        mults, shifts = [], []
        for ratio in row_scale / out_scale:
            shift = MULTIPLIER_BITS - 1 - int(np.floor(np.log2(ratio)))
            mults.append(int(round(ratio * 2.0 ** shift)))
            shifts.append(shift)
        offset = tuple(int(v) for v in np.round(audit.offset / out_scale))
        return cls(weights, tuple(mults), tuple(shifts), offset, input_scales,
                   int(round((audit.threshold / out_scale) ** 2)))

    def flags(self, x: np.ndarray) -> bool:
        xq = np.clip(np.round(np.asarray(x, dtype=np.float64) / self.input_scales), -INT16_MAX, INT16_MAX).astype(np.int64)
        acc = self.weights.astype(np.int64) @ xq  # |acc| <= 32767^2 * d: fits int64 for d < 8.5e9
        total = 0
        for a, m, sh, off in zip(acc.tolist(), self.multipliers, self.shifts, self.offset):
            y = ((a * m) >> sh if sh >= 0 else (a * m) << -sh) + off  # Python ints: exact, no overflow
            total += y * y
        return total >= self.threshold_sq


def decision_agreement(audit: LatentAudit, fixed: FixedPointAudit, rows: np.ndarray) -> float:
    """Share of rows where the fixed-point scorer and float agree on flagged / not flagged."""
    same = [fixed.flags(r) == (audit.distance(r) >= audit.threshold) for r in np.asarray(rows)]
    return float(np.mean(same)) if same else 1.0
