"""The inference layer's types <-> the detection API's messages (extproc.api.v1).

One place for both directions, so the server and the remote engine cannot disagree on a field.
"""

from __future__ import annotations

from typing import Sequence

from extproc.api.v1 import detection_pb2 as pb
from extproc.inference.api import Claim, DetectionResult, ModelInfo, SentinelResult, Span


def detect_request(context: Sequence[str], question: str | None, answer: str,
                   signals: frozenset[str] | None) -> pb.DetectRequest:
    req = pb.DetectRequest(context=list(context), answer=answer)
    if question is not None:
        req.question = question
    if signals is not None:
        req.signals.CopyFrom(pb.SignalSet(names=sorted(signals)))
    return req


def detect_args(req: pb.DetectRequest) -> tuple[list[str], str | None, str, frozenset[str] | None]:
    """(context, question, answer, signals) as `Engine.detect` takes them."""
    question = req.question if req.HasField("question") else None
    signals = frozenset(req.signals.names) if req.HasField("signals") else None
    return list(req.context), question, req.answer, signals


def span_to_proto(s: Span) -> pb.Span:
    out = pb.Span(start=s.start, end=s.end, text=s.text, score=s.score, tokens=s.tokens)
    if s.nli_label is not None:
        out.nli_label = s.nli_label
    if s.nli_confidence is not None:
        out.nli_confidence = s.nli_confidence
    if s.severity is not None:
        out.severity = s.severity
    return out


def span_from_proto(s: pb.Span) -> Span:
    return Span(
        start=s.start, end=s.end, text=s.text, score=s.score, tokens=s.tokens,
        nli_label=s.nli_label if s.HasField("nli_label") else None,
        nli_confidence=s.nli_confidence if s.HasField("nli_confidence") else None,
        severity=s.severity if s.HasField("severity") else None,
    )


def detection_to_proto(r: DetectionResult) -> pb.DetectResponse:
    return pb.DetectResponse(
        score=r.score, spans=[span_to_proto(s) for s in r.spans], windows=r.windows, dropped_spans=r.dropped_spans,
        latency_ms=r.latency_ms, timings_ms=dict(r.timings_ms), signals=list(r.signals),
    )


def detection_from_proto(r: pb.DetectResponse) -> DetectionResult:
    return DetectionResult(
        score=r.score, spans=tuple(span_from_proto(s) for s in r.spans), windows=r.windows,
        dropped_spans=r.dropped_spans, latency_ms=r.latency_ms, timings_ms=dict(r.timings_ms),
        signals=tuple(r.signals),
    )


def sentinel_to_proto(r: SentinelResult) -> pb.ClassifyPromptResponse:
    return pb.ClassifyPromptResponse(needs_check=r.needs_check, confidence=r.confidence, latency_ms=r.latency_ms,
                                     decided_by=r.by)


def sentinel_from_proto(r: pb.ClassifyPromptResponse) -> SentinelResult:
    return SentinelResult(needs_check=r.needs_check, confidence=r.confidence, latency_ms=r.latency_ms,
                          by=r.decided_by or "model")


def claims_to_proto(claims: Sequence[Claim], latency_ms: float) -> pb.ExplainResponse:
    return pb.ExplainResponse(
        claims=[pb.Claim(start=c.start, end=c.end, sentence=c.sentence, label=c.label, confidence=c.confidence,
                         entailment=c.entailment) for c in claims],
        latency_ms=latency_ms,
    )


def claims_from_proto(r: pb.ExplainResponse) -> tuple[Claim, ...]:
    return tuple(Claim(c.start, c.end, c.sentence, c.label, c.confidence, c.entailment) for c in r.claims)


def models_to_proto(models: Sequence[ModelInfo]) -> list[pb.ModelInfo]:
    return [pb.ModelInfo(role=m.role, name=m.name, provider=m.provider) for m in models]


def models_from_proto(models: Sequence[pb.ModelInfo], where: str) -> tuple[ModelInfo, ...]:
    """`where`: the endpoint, reported as the model's path."""
    return tuple(ModelInfo(m.role, m.name, where, m.provider) for m in models)
