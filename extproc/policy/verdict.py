"""What TruthLens concluded about one response.

"Could not check" is never "clean": every outcome that is not a finished
detection gets its own status (and a reason), so clients and dashboards can
tell a verified answer from one nobody looked at.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping, Sequence

from extproc.inference.api import DetectionResult, Span
from extproc.inference.upstream import UpstreamSignals
from extproc.policy.decisions import Decision


class Status(StrEnum):
    CHECKED = "checked"  # the detector ran on the answer
    SKIPPED = "skipped"  # the sentinel judged the prompt non-factual: nothing to check
    UNVERIFIED = "unverified"  # factual prompt but no grounding context to check against
    UNCHECKED = "unchecked"  # should have been checked but could not be (see UncheckedReason)
    DISABLED = "disabled"  # TruthLens is off for this request's decision


class UncheckedReason(StrEnum):
    ERROR = "error"  # unexpected failure inside the sidecar
    TIMEOUT = "timeout"  # inference_timeout_ms passed
    TOO_LARGE = "too_large"  # body over max_body_bytes, or detection over batching.max_request_tokens
    OVERLOADED = "overloaded"  # batching.max_queue admission limit hit
    MODELS_UNAVAILABLE = "models_unavailable"  # no detector loaded
    UNSUPPORTED_CONTENT = "unsupported_content"  # not JSON/SSE chat completions, compressed body, ...
    BAD_JSON = "bad_json"  # body claims JSON but does not parse
    UPSTREAM_ERROR = "upstream_error"  # upstream answered non-2xx: nothing to judge
    NO_ANSWER = "no_answer"  # a response with no assistant text (tool calls only, empty)
    INCOMPLETE = "incomplete"  # a stream that ended with neither [DONE] nor a finish reason (cut upstream)


class UnverifiedReason(StrEnum):
    NO_CONTEXT = "no_context"  # no system/tool/RAG documents in the request
    TOOLS_WITHOUT_RESULTS = "tools_without_results"  # tools declared, no tool results yet


class SkippedReason(StrEnum):
    NON_FACTUAL = "non_factual"  # sentinel said the prompt needs no fact-check


@dataclass(slots=True)  # a value: never mutated (dataclasses.replace makes a new one); not frozen
class Verdict:              # because one is built per request and frozen construction costs ~4x more
    status: Status
    mode: str
    decision: str | None = None
    reason: str | None = None
    score: float | None = None  # only when status is checked
    detected: bool = False  # only ever true when status is checked
    spans: tuple[Span, ...] = ()
    iterations: int = 0  # detector passes (standard mode refines and re-checks)
    latency_ms: float = 0.0  # time TruthLens added to this request
    signals: tuple[str, ...] = ()  # what the score is made of (checked only): detector, verifier, context_pmi
    # what standard/premium mode did (None / () when it did not run)
    original_score: float | None = None  # the score before mitigation
    refined: bool | None = None  # standard: a rewrite replaced the answer
    refine_rejected: tuple[str, ...] = ()  # standard: why rewrites were not taken (policy.refinement reasons)
    verifiers: tuple[int, int] | None = None  # premium: (verifiers that answered, verifiers asked)
    upstream: UpstreamSignals | None = None  # the writer's own token logprobs (worst choice), when asked for

    @property
    def enabled(self) -> bool:
        return self.status is not Status.DISABLED

    @property
    def actionable(self) -> bool:
        """Actions (warn, block) only fire on a finished check that found something."""
        return self.status is Status.CHECKED and self.detected

    @classmethod
    def disabled(cls, decision: Decision) -> Verdict:
        return cls(Status.DISABLED, decision.mode, decision.name)

    @classmethod
    def skipped(cls, decision: Decision, latency_ms: float = 0.0) -> Verdict:
        return cls(Status.SKIPPED, decision.mode, decision.name, SkippedReason.NON_FACTUAL, latency_ms=latency_ms)

    @classmethod
    def unverified(
        cls, decision: Decision, reason: str = UnverifiedReason.NO_CONTEXT, latency_ms: float = 0.0
    ) -> Verdict:
        return cls(Status.UNVERIFIED, decision.mode, decision.name, reason, latency_ms=latency_ms)

    @classmethod
    def unchecked(
        cls, decision: Decision, reason: str, latency_ms: float = 0.0, iterations: int = 0
    ) -> Verdict:
        return cls(
            Status.UNCHECKED, decision.mode, decision.name, reason, iterations=iterations, latency_ms=latency_ms
        )

    @classmethod
    def checked(
        cls,
        decision: Decision,
        result: DetectionResult,
        iterations: int = 1,
        latency_ms: float | None = None,
        require_spans: bool = False,
    ) -> Verdict:
        """`detected` compares the score with the decision's threshold (thresholds.response by default);
        with `require_spans` (premium's cross-check) it also needs at least one span."""
        return cls(
            Status.CHECKED,
            decision.mode,
            decision.name,
            score=result.score,
            detected=result.score >= decision.threshold and (bool(result.spans) or not require_spans),
            spans=tuple(result.spans),
            iterations=iterations,
            latency_ms=result.latency_ms if latency_ms is None else latency_ms,
            signals=tuple(result.signals),
        )


def cross_check_score(original: float, against: float, confirmed: bool, threshold: float) -> float:
    """Premium's score: the lower of the detection against the documents and the one against the
    verifiers' answers; when no span was confirmed, also just under the threshold (rounded down to
    the header's 4 decimals), so that score, `detected` and the spans agree."""
    score = min(original, against)
    if not confirmed:
        score = min(score, max((round(threshold * 10_000) - 1) / 10_000, 0.0))
    return score


def top_spans(spans: Sequence[Span], limit: int) -> list[Span]:
    """The `limit` highest-scoring spans, back in answer order (what summaries show)."""
    best = sorted(spans, key=lambda s: -s.score)[: max(limit, 0)]
    return sorted(best, key=lambda s: (s.start, s.end))


def early_verdict(decision: Decision, status: Status, reason: str | None, latency_ms: float) -> Verdict:
    """A verdict fixed before the answer arrived (disabled, skipped, unverified, unchecked)."""
    if status == Status.DISABLED:
        return Verdict.disabled(decision)
    if status == Status.SKIPPED:
        return Verdict.skipped(decision, latency_ms=latency_ms)
    if status == Status.UNVERIFIED:
        return Verdict.unverified(decision, reason or UnverifiedReason.NO_CONTEXT, latency_ms)
    return Verdict.unchecked(decision, reason or UncheckedReason.ERROR, latency_ms=latency_ms)


def worst_choice_verdict(decision: Decision, by_choice: Mapping[int, DetectionResult], latency_ms: float) -> Verdict:
    """Several choices were judged: the response's verdict follows the worst one."""
    worst = max(by_choice.values(), key=lambda r: r.score)
    return Verdict.checked(decision, worst, iterations=1, latency_ms=latency_ms)


def verdict_payload(v: Verdict) -> dict[str, object]:
    """The verdict as JSON (the `truthlens` object of the final SSE event): the same facts as the headers."""
    out: dict[str, object] = {
        "enabled": v.enabled,
        "status": str(v.status),
        "mode": v.mode,
        "decision": v.decision,
        "reason": None if v.reason is None else str(v.reason),
        "iterations": v.iterations,
        "latency_ms": round(v.latency_ms, 1),
    }
    if v.status is Status.CHECKED:
        out["score"] = round(v.score or 0.0, 4)
        out["detected"] = v.detected
        out["signals"] = list(v.signals)
        out["spans"] = [
            {"start": s.start, "end": s.end, "text": s.text, "score": round(s.score, 4), "label": s.nli_label}
            for s in v.spans
        ]
    out.update(mitigation_facts(v))
    if v.upstream is not None:
        u = v.upstream
        out["upstream"] = {"tokens": u.tokens, "mean_logprob": round(u.mean_logprob, 4),
                           "min_logprob": round(u.min_logprob, 4),
                           "mean_entropy": None if u.mean_entropy is None else round(u.mean_entropy, 4)}
    return out


def mitigation_facts(v: Verdict) -> dict[str, object]:
    """What standard/premium mode did, for JSON payloads (the headers say the same)."""
    out: dict[str, object] = {}
    if v.original_score is not None:
        out["original_score"] = round(v.original_score, 4)
    if v.refined is not None:
        out["refined"] = v.refined
        out["refine_rejected"] = list(v.refine_rejected)
    if v.verifiers is not None:
        out["verifiers"] = {"answered": v.verifiers[0], "asked": v.verifiers[1]}
    return out
