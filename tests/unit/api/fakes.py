"""A TEST ENGINE (not a model) served over the detection API by the unit tests."""

from __future__ import annotations

import asyncio
from typing import Sequence

from extproc.inference.api import (
    Claim,
    DetectionResult,
    InferenceError,
    ModelInfo,
    ModelUnavailable,
    Overloaded,
    SentinelResult,
    Span,
)


class FakeEngine:
    """Detect: one span on the word "Oslo" (score 0.9) or none (0.1). Answers starting with OVERLOAD /
    ERROR / CRASH / SLOW / INVALID misbehave. `calls` counts detect calls (which server answered)."""

    def __init__(self, roles: Sequence[str] = ("sentinel", "detector", "explainer"), name: str = "fake") -> None:
        self.roles = set(roles)
        self.name = name
        self.calls = 0
        self.seen: list[tuple] = []

    def models(self) -> Sequence[ModelInfo]:
        return tuple(ModelInfo(r, f"{self.name}-{r}", "<memory>", "TestProvider") for r in sorted(self.roles))

    def has(self, role: str) -> bool:
        return role in self.roles

    @property
    def signals(self) -> frozenset[str]:
        return frozenset({"context_pmi"})

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        return SentinelResult(False, 0.001, 0.01, by="prefilter") if "poem" in prompt else None

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        if "sentinel" not in self.roles:
            raise ModelUnavailable("sentinel model not loaded")
        return SentinelResult(True, 0.8, 1.5)

    async def detect(self, context: Sequence[str], question: str | None, answer: str,
                     signals: frozenset[str] | None = None) -> DetectionResult:
        self.calls += 1
        self.seen.append((tuple(context), question, answer, signals))
        if "detector" not in self.roles:
            raise ModelUnavailable("detector model not loaded")
        if answer.startswith("OVERLOAD"):
            raise Overloaded("queue full")
        if answer.startswith("ERROR"):
            raise InferenceError("model failed")
        if answer.startswith("CRASH"):
            raise RuntimeError("boom")
        if answer.startswith("INVALID"):
            raise ValueError("bad request")
        if answer.startswith("SLOW"):
            await asyncio.sleep(5)
        at = answer.find("Oslo")
        if at < 0:
            return DetectionResult(score=0.1, spans=(), windows=1, latency_ms=2.0, signals=("detector",))
        span = Span(at, at + 4, "Oslo", 0.9, 2, nli_label="contradiction", nli_confidence=0.7, severity=4)
        plain = Span(0, 3, answer[:3], 0.6, 1)
        return DetectionResult(score=0.9, spans=(span, plain), windows=2, dropped_spans=1, latency_ms=3.0,
                               timings_ms={"detector": 1.0, "verifier": 2.0}, signals=("detector", "verifier"))

    async def explain(self, context: Sequence[str], answer: str,
                      ranges: Sequence[tuple[int, int]] | None = None) -> tuple[Claim, ...]:
        if not context:
            raise ValueError("explain needs at least one non-empty context passage")
        pieces = ranges or [(0, len(answer))]
        return tuple(Claim(a, b, answer[a:b], "neutral", 0.6, 0.2) for a, b in pieces)

    async def close(self) -> None:
        return None
