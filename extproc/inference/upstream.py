"""Signals from the upstream model's own token log-probabilities (the model that wrote the answer).

How sure the writer was of each token it chose (mean and minimum log-probability) and how spread its
next-token distribution was (entropy over the top alternatives it returned, renormalised: a lower
bound of the full distribution's entropy, since the tail is missing). Always reported; fused into the
response score only through a `WriterFusion` fit for that very writer: logprob scales belong to the
model (measured: a weight fitted on one writer's answers has no skill on another's,
bench/results/writer-logprobs.md), so a fit names the upstream models it was made on and is used for
no other (docs/inference.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from extproc.inference.api import DetectionResult
from extproc.inference.calibration import Calibration, CalibrationError, CalibrationSet

RAW_SCORE = "response"  # what a writer fit stacks on: the gateway's (calibrated) response score
SIGNALS = ("upstream_mean_logprob", "upstream_min_logprob", "upstream_mean_entropy")


@dataclass(frozen=True, slots=True)
class UpstreamSignals:
    tokens: int
    mean_logprob: float  # mean log p(chosen token): near 0 = confident
    min_logprob: float  # the least likely token the writer still chose
    mean_entropy: float | None  # nats, mean over tokens with top alternatives; None without any


def upstream_signals(tokens: Sequence[tuple[float, Sequence[float]]]) -> UpstreamSignals | None:
    """From (log p of the chosen token, log p of the top alternatives) per answer token; None for no tokens."""
    finite = [(lp, top) for lp, top in tokens if math.isfinite(lp)]
    if not finite:
        return None
    entropies = [entropy(top) for _, top in finite if len(top) > 1]
    return UpstreamSignals(
        tokens=len(finite),
        mean_logprob=sum(lp for lp, _ in finite) / len(finite),
        min_logprob=min(lp for lp, _ in finite),
        mean_entropy=sum(entropies) / len(entropies) if entropies else None,
    )


def entropy(logprobs: Sequence[float]) -> float:
    """Entropy (nats) of the distribution the log-probabilities give, renormalised over them."""
    finite = [lp for lp in logprobs if math.isfinite(lp)]
    if not finite:
        return 0.0
    top = max(finite)
    weights = [math.exp(lp - top) for lp in finite]
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights if w > 0)


def signal_values(s: UpstreamSignals) -> dict[str, float]:
    """The named values a writer fit can weigh (no entropy without returned alternatives)."""
    out = {"upstream_mean_logprob": s.mean_logprob, "upstream_min_logprob": s.min_logprob}
    if s.mean_entropy is not None:
        out["upstream_mean_entropy"] = s.mean_entropy
    return out


@dataclass(frozen=True)
class WriterFusion:
    """Per upstream model (the response's `model`): the response score stacked with that writer's own logprob
    signals, `p = sigmoid(a logit(score) + sum w_k signal_k + b)`, fitted on its labelled answers
    (`truthlens fit-upstream`). A response from a model without a fit, or without logprobs, keeps its score."""

    fits: Mapping[str, Calibration]

    @classmethod
    def load(cls, path: str | Path) -> "WriterFusion":
        by_model: dict[str, Calibration] = {}
        for i, fit in enumerate(CalibrationSet.load(path).fits):
            models = fit.fitted_on.get("upstream_models")
            where = f"{path} fit {i}"
            if fit.raw_score != RAW_SCORE:
                raise CalibrationError(f"{where}: stacks on {fit.raw_score!r}, a writer fit stacks on {RAW_SCORE!r}")
            if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
                raise CalibrationError(f"{where}: fitted_on.upstream_models must list the models it was fitted on")
            if not fit.signals or not set(fit.signals) <= set(SIGNALS):
                raise CalibrationError(f"{where}: signals {sorted(fit.signals)} are not among {list(SIGNALS)}")
            for model in models:
                if model in by_model:
                    raise CalibrationError(f"{where}: a second fit for upstream model {model!r}")
                by_model[model] = fit
        return cls(by_model)

    def fuse(self, model: str | None, result: DetectionResult, signals: UpstreamSignals | None) -> DetectionResult:
        """The result with its score stacked with the writer's signals, naming them in `signals`; unchanged
        when this writer has no fit or a signal its fit needs is missing."""
        fit = self.fits.get(model) if model is not None else None
        if fit is None or signals is None:
            return result
        values = signal_values(signals)
        if not set(fit.signals) <= set(values):
            return result
        return replace(result, score=fit(result.score, values), signals=(*result.signals, *sorted(fit.signals)))
