"""Signals from the upstream model's own token log-probabilities (the model that wrote the answer).

How sure the writer was of each token it chose (mean and minimum log-probability) and how spread its
next-token distribution was (entropy over the top alternatives it returned, renormalised: a lower
bound of the full distribution's entropy, since the tail is missing). Reported, not fused: no
real-output set in the project's data carries the writers' logprobs, so no calibration fit can use
them honestly yet (docs/inference.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


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
