"""Turn a Verdict and its Decision into what goes back on the wire.

Pure functions: the service layer applies the plan (header mutations, the
warning appended to each choice, or an immediate response). Every documented
action does something visible; warn and block fire only on a finished check
that detected a hallucination, never on "could not check".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from extproc.config import TruthLensConfig
from extproc.inference.api import Span
from extproc.policy.decisions import Decision
from extproc.policy.verdict import Status, Verdict, mitigation_facts, top_spans

LATENCY_HEADER = "x-truthlens-latency-ms"
STREAMING_STATUS = "streaming"  # x-truthlens-status while an SSE answer is still on its way
SPANS_HEADER_MAX_SPANS = 16
SPANS_HEADER_MAX_BYTES = 1024
WARNING_MAX_SPANS = 5
WARNING_SPAN_CHARS = 80
BLOCK_MAX_SPANS = 32
BLOCK_SPAN_CHARS = 200
BLOCK_ERROR_TYPE = "hallucination_detected"
BLOCK_ERROR_CODE = "truthlens_blocked"

Headers = tuple[tuple[str, str], ...]

# Built once: json.dumps with non-default arguments constructs a new encoder per call (~10 us).
_COMPACT = json.JSONEncoder(separators=(",", ":"))
_COMPACT_UTF8 = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class BlockResponse:
    status: int
    headers: Headers  # content-type plus the x-truthlens-* set
    body: bytes  # OpenAI error JSON


@dataclass(frozen=True, slots=True)
class ActionPlan:
    headers: Headers = ()  # add to the response (action none: nothing)
    warning: str | None = None  # append to every choice's content (action warn)
    block: BlockResponse | None = None  # replace the response (action block)


def plan_actions(verdict: Verdict, decision: Decision, tl: TruthLensConfig) -> ActionPlan:
    if decision.action == "none":
        return ActionPlan()
    headers = response_headers(verdict)
    if not verdict.actionable or decision.action == "header":
        return ActionPlan(headers)
    if decision.action == "warn":
        return ActionPlan(headers, warning=warning_text(verdict, tl.warning_template))
    if decision.action == "block":
        return ActionPlan(headers, block=block_response(verdict, decision, tl.block_status, headers))
    raise ValueError(f"unknown action {decision.action!r}")  # config validation makes this unreachable


def streaming_headers(decision: Decision) -> Headers:
    """What an SSE answer's headers can say before the answer exists (the verdict comes as the last event)."""
    out = [("x-truthlens-enabled", "true"), ("x-truthlens-status", STREAMING_STATUS), ("x-truthlens-mode", decision.mode)]
    if decision.name is not None:
        out.append(("x-truthlens-decision", decision.name))
    return tuple(out)


def response_headers(verdict: Verdict) -> Headers:
    """The x-truthlens-* set; score/detected/spans only exist when a check finished."""
    out: list[tuple[str, str]] = [
        ("x-truthlens-enabled", _bool(verdict.enabled)),
        ("x-truthlens-status", str(verdict.status)),
        ("x-truthlens-mode", verdict.mode),
    ]
    if verdict.decision is not None:
        out.append(("x-truthlens-decision", verdict.decision))
    if verdict.reason is not None:
        out.append(("x-truthlens-reason", str(verdict.reason)))
    if verdict.status is Status.DISABLED:
        return tuple(out)
    if verdict.status is Status.CHECKED and verdict.score is not None:
        out += [
            ("x-truthlens-score", f"{verdict.score:.4f}"),
            ("x-truthlens-detected", _bool(verdict.detected)),
            ("x-truthlens-span-count", str(len(verdict.spans))),
            ("x-truthlens-spans", spans_header_value(verdict.spans)),
        ]
        if verdict.signals:
            out.append(("x-truthlens-signals", ",".join(verdict.signals)))
        out += mitigation_headers(verdict)
        out += upstream_headers(verdict)
    out += [
        ("x-truthlens-iterations", str(verdict.iterations)),
        (LATENCY_HEADER, latency_header_value(verdict.latency_ms)),
    ]
    return tuple(out)


def mitigation_headers(verdict: Verdict) -> list[tuple[str, str]]:
    """What standard/premium mode did: the score before it, whether a rewrite replaced the answer (and
    why rewrites were not taken), how many verifiers answered. Nothing when no mitigation ran."""
    out: list[tuple[str, str]] = []
    if verdict.original_score is not None:
        out.append(("x-truthlens-original-score", f"{verdict.original_score:.4f}"))
    if verdict.refined is not None:
        out.append(("x-truthlens-refined", _bool(verdict.refined)))
        if verdict.refine_rejected:
            out.append(("x-truthlens-refine-rejected", ",".join(verdict.refine_rejected)))
    if verdict.verifiers is not None:
        out.append(("x-truthlens-verifiers", f"{verdict.verifiers[0]}/{verdict.verifiers[1]}"))
    return out


def upstream_headers(verdict: Verdict) -> list[tuple[str, str]]:
    """The upstream's own token logprobs for the judged answer (when the decision asked for them)."""
    u = verdict.upstream
    if u is None:
        return []
    out = [("x-truthlens-upstream-tokens", str(u.tokens)), ("x-truthlens-upstream-logprob", f"{u.mean_logprob:.4f}"),
           ("x-truthlens-upstream-min-logprob", f"{u.min_logprob:.4f}")]
    if u.mean_entropy is not None:
        out.append(("x-truthlens-upstream-entropy", f"{u.mean_entropy:.4f}"))
    return out


def latency_header_value(latency_ms: float) -> str:
    return f"{latency_ms:.1f}"


def spans_header_value(
    spans: Sequence[Span], max_spans: int = SPANS_HEADER_MAX_SPANS, max_bytes: int = SPANS_HEADER_MAX_BYTES
) -> str:
    """Compact JSON `[[start,end,score,label],...]`: the highest-scoring spans that fit, in answer order.

    Offsets are characters of the assistant content; label is the explainer's
    NLI label or null. `x-truthlens-span-count` says how many spans there were.
    """
    kept: list[tuple[Span, str]] = []
    size = 2  # the brackets
    for span in sorted(spans, key=lambda s: -s.score)[: max(max_spans, 0)]:
        label = "null" if span.nli_label is None else _COMPACT.encode(span.nli_label)
        item = f"[{int(span.start)},{int(span.end)},{round(float(span.score), 3)!r},{label}]"
        if size + len(item) + (1 if kept else 0) > max_bytes:
            break
        kept.append((span, item))
        size += len(item) + (1 if len(kept) > 1 else 0)
    kept.sort(key=lambda pair: (pair[0].start, pair[0].end))
    return "[" + ",".join(item for _, item in kept) + "]"


def warning_text(verdict: Verdict, template: str) -> str:
    """`template` with {score} and {spans} (quoted excerpts of the top spans); validated at config load."""
    excerpts = [_quote(s.text, WARNING_SPAN_CHARS) for s in top_spans(verdict.spans, WARNING_MAX_SPANS)]
    more = len(verdict.spans) - len(excerpts)
    spans_text = ", ".join(excerpts) if excerpts else "no specific span"
    if more > 0:
        spans_text += f" and {more} more"
    return template.format(score=verdict.score or 0.0, spans=spans_text)


def block_response(
    verdict: Verdict, decision: Decision, status: int, headers: Headers | None = None
) -> BlockResponse:
    """OpenAI-style error body so SDK clients raise a normal APIError carrying our details."""
    score = verdict.score or 0.0
    # the message names what the body's `decision` says: a decision, or none (null: the global settings)
    source = f"decision {decision.name}" if decision.name is not None else "no decision matched: global settings"
    error = {
        "message": (
            f"TruthLens blocked this response: hallucination score {score:.2f} is at or above "
            f"the threshold {decision.threshold:.2f} ({source})."
        ),
        "type": BLOCK_ERROR_TYPE,
        "param": None,
        "code": BLOCK_ERROR_CODE,
        "truthlens": {
            "status": str(verdict.status),
            "decision": decision.name,
            "mode": verdict.mode,
            "score": round(score, 4),
            "threshold": decision.threshold,
            "iterations": verdict.iterations,
            "signals": list(verdict.signals),
            **mitigation_facts(verdict),
            "span_count": len(verdict.spans),
            "spans": [
                {
                    "start": s.start,
                    "end": s.end,
                    "text": s.text[:BLOCK_SPAN_CHARS],
                    "score": round(s.score, 4),
                    "label": s.nli_label,
                }
                for s in top_spans(verdict.spans, BLOCK_MAX_SPANS)
            ],
        },
    }
    body = _COMPACT_UTF8.encode({"error": error}).encode("utf-8")
    all_headers = (("content-type", "application/json"),) + (headers if headers is not None else response_headers(verdict))
    return BlockResponse(status, all_headers, body)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _quote(text: str, limit: int) -> str:
    """The span, whitespace-folded; a long one is cut at a word boundary so it quotes whole words."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        head = flat[: limit - 1]
        cut = head.rfind(" ")
        flat = (head[:cut] if cut > 0 else head) + "…"
    return _COMPACT_UTF8.encode(flat)
