"""The contract between the gateway and the models.

The service layer only sees these types and the `Engine` protocol, so the
inference layer can change (batching, providers, windowing) without touching
Envoy code, and the gateway can run with no models at all (`NullEngine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


class InferenceError(Exception):
    """A model could not produce a result; the response passes through unchecked."""


class Overloaded(InferenceError):
    """The admission limit was hit: answer now instead of queueing forever."""


# The request budget's cheap first check, before any tokenizing: text longer than this many characters per
# token of batching.max_request_tokens is refused unread (English runs ~4 characters per token; only text like
# a run of 100-character "words" packs more, and is refused by this check rather than counted).
MAX_CHARS_PER_TOKEN = 8


class TooLarge(InferenceError):
    """The request is over its token budget (batching.max_request_tokens): refused at once, before any
    model work, so one huge request cannot hold the models for everyone else."""


class ModelUnavailable(InferenceError):
    """No model is loaded for this role (missing directory, load failure)."""


@dataclass(slots=True)  # not frozen: one is built per request, and frozen construction costs ~4x more
class SentinelResult:
    needs_check: bool
    confidence: float  # probability that the prompt needs fact-checking
    latency_ms: float = 0.0
    by: str = "model"  # "model" (the encoder) or "prefilter" (decided lexically, no forward pass)


@dataclass(frozen=True, slots=True)
class Span:
    start: int  # character offsets into the answer
    end: int
    text: str
    score: float  # max token probability inside the span
    tokens: int
    nli_label: str | None = None  # entailment | neutral | contradiction (explainer)
    nli_confidence: float | None = None
    severity: int | None = None  # contradiction 4, neutral 2


@dataclass(frozen=True, slots=True)
class DetectionResult:
    score: float  # response-level hallucination score in [0, 1]
    spans: tuple[Span, ...]
    windows: int = 1  # how many context windows the detector ran
    dropped_spans: int = 0  # spans the explainer judged entailed
    latency_ms: float = 0.0
    timings_ms: dict[str, float] = field(default_factory=dict)  # per stage: detector, explainer
    signals: tuple[str, ...] = ()  # what the score is made of: detector, verifier, context_pmi


@dataclass(frozen=True, slots=True)
class Claim:
    """The explainer's NLI verdict on one piece of an answer (an engine's optional `explain`)."""

    start: int  # character offsets into the answer: the requested range, or the sentence's bounds
    end: int
    sentence: str  # the hypothesis judged: the sentence(s) holding [start, end)
    label: str  # entailment | neutral | contradiction
    confidence: float
    entailment: float  # max P(entailment) over the context windows


@dataclass(frozen=True, slots=True)
class ModelInfo:
    role: str  # sentinel | detector | explainer | surrogate
    name: str
    path: str
    provider: str  # CPUExecutionProvider | CUDAExecutionProvider


class Engine(Protocol):
    """What the service layer calls. Every method is safe to await on the event loop."""

    def models(self) -> Sequence[ModelInfo]: ...

    def has(self, role: str) -> bool: ...

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        """A verdict without inference when a cheap check is sure of it (sync, microseconds); else None."""
        ...

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        """P(factual) for the prompt; `prefiltered`: the caller already asked `prefilter_prompt`
        and it was unsure, so go straight to the model."""
        ...

    async def detect(
        self, context: Sequence[str], question: str | None, answer: str, signals: frozenset[str] | None = None
    ) -> DetectionResult:
        """`signals`: the white-box signals this request may use (None: every one the engine has)."""
        ...

    async def close(self) -> None: ...


class NullEngine:
    """Used when no model is configured or loadable: the gateway runs and says so."""

    def models(self) -> Sequence[ModelInfo]:
        return ()

    def has(self, role: str) -> bool:
        return False

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        return None

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        raise ModelUnavailable("sentinel model not loaded")

    async def detect(
        self, context: Sequence[str], question: str | None, answer: str, signals: frozenset[str] | None = None
    ) -> DetectionResult:
        raise ModelUnavailable("detector model not loaded")

    async def close(self) -> None:
        return None
