"""Verdict + decision -> headers, warning, block response, or nothing."""

from __future__ import annotations

import json

import pytest

from extproc.config import default_config, parse_config
from extproc.inference.api import DetectionResult, Span
from extproc.policy.actions import (
    SPANS_HEADER_MAX_BYTES,
    block_response,
    plan_actions,
    response_headers,
    spans_header_value,
    warning_text,
)
from extproc.policy.decisions import Decision
from extproc.policy.verdict import Status, UncheckedReason, UnverifiedReason, Verdict

TL = default_config().truthlens
SPANS = (
    Span(0, 5, "Paris", 0.91, 2, nli_label="contradiction"),
    Span(20, 34, "built in 1999", 0.62, 3),
)
RESULT = DetectionResult(score=0.83, spans=SPANS, latency_ms=12.5)


def dec(action: str, threshold: float = 0.5, name: str | None = "d") -> Decision:
    return Decision(name, True, "lightweight", threshold, action)


def headers_dict(headers: tuple[tuple[str, str], ...]) -> dict[str, str]:
    assert len({k for k, _ in headers}) == len(headers), "duplicate header"
    return dict(headers)


def test_checked_headers() -> None:
    verdict = Verdict.checked(dec("header"), RESULT, iterations=1)
    h = headers_dict(response_headers(verdict))
    assert h == {
        "x-truthlens-enabled": "true",
        "x-truthlens-status": "checked",
        "x-truthlens-mode": "lightweight",
        "x-truthlens-decision": "d",
        "x-truthlens-score": "0.8300",
        "x-truthlens-detected": "true",
        "x-truthlens-span-count": "2",
        "x-truthlens-spans": '[[0,5,0.91,"contradiction"],[20,34,0.62,null]]',
        "x-truthlens-iterations": "1",
        "x-truthlens-latency-ms": "12.5",
    }


def test_the_signals_behind_a_score_are_named_in_headers_block_body_and_sse_verdict() -> None:
    from dataclasses import replace

    from extproc.policy.verdict import verdict_payload

    verdict = Verdict.checked(dec("block"), replace(RESULT, signals=("detector", "verifier", "context_pmi")))
    assert headers_dict(response_headers(verdict))["x-truthlens-signals"] == "detector,verifier,context_pmi"
    body = json.loads(block_response(verdict, dec("block"), 422, ()).body)
    assert body["error"]["truthlens"]["signals"] == ["detector", "verifier", "context_pmi"]
    assert verdict_payload(verdict)["signals"] == ["detector", "verifier", "context_pmi"]
    assert "x-truthlens-signals" not in headers_dict(response_headers(Verdict.checked(dec("header"), RESULT)))


def test_detected_follows_the_decision_threshold() -> None:
    assert Verdict.checked(dec("header", threshold=0.9), RESULT).detected is False
    assert Verdict.checked(dec("header", threshold=0.83), RESULT).detected is True  # at threshold counts


@pytest.mark.parametrize(
    ("verdict", "status", "reason"),
    [
        (Verdict.skipped(dec("header")), "skipped", "non_factual"),
        (Verdict.unverified(dec("header")), "unverified", "no_context"),
        (Verdict.unverified(dec("header"), UnverifiedReason.TOOLS_WITHOUT_RESULTS), "unverified", "tools_without_results"),
        (Verdict.unchecked(dec("header"), UncheckedReason.TIMEOUT, 5000.0), "unchecked", "timeout"),
        (Verdict.unchecked(dec("header"), UncheckedReason.TOO_LARGE), "unchecked", "too_large"),
    ],
)
def test_statuses_other_than_checked_carry_no_score(verdict: Verdict, status: str, reason: str) -> None:
    h = headers_dict(response_headers(verdict))
    assert h["x-truthlens-status"] == status
    assert h["x-truthlens-reason"] == reason
    assert h["x-truthlens-enabled"] == "true"
    for absent in ("x-truthlens-score", "x-truthlens-detected", "x-truthlens-spans"):
        assert absent not in h  # "could not check" must never read as "clean"


def test_disabled_headers() -> None:
    h = headers_dict(response_headers(Verdict.disabled(Decision("off", False, "lightweight", 0.5, "header"))))
    assert h == {
        "x-truthlens-enabled": "false",
        "x-truthlens-status": "disabled",
        "x-truthlens-mode": "lightweight",
        "x-truthlens-decision": "off",
    }


def test_header_action_only_adds_headers() -> None:
    plan = plan_actions(Verdict.checked(dec("header"), RESULT), dec("header"), TL)
    assert plan.headers and plan.warning is None and plan.block is None


def test_warn_action_uses_the_template() -> None:
    tl = parse_config({"truthlens": {"warning_template": "[score {score:.1f}] {spans}"}}).truthlens
    plan = plan_actions(Verdict.checked(dec("warn"), RESULT), dec("warn"), tl)
    assert plan.warning == '[score 0.8] "Paris", "built in 1999"'
    assert plan.block is None and headers_dict(plan.headers)["x-truthlens-detected"] == "true"


def test_warning_truncates_long_and_many_spans() -> None:
    spans = tuple(Span(i * 10, i * 10 + 5, f"span{i} " + "x" * 200, 0.5 + i / 100, 2) for i in range(8))
    verdict = Verdict.checked(dec("warn"), DetectionResult(0.9, spans))
    text = warning_text(verdict, "{spans}")
    assert text.endswith(" and 3 more")
    assert "span7" in text and "span2" not in text  # the top-scoring five
    assert all(len(part) <= 82 for part in text.removesuffix(" and 3 more").split(", "))


def test_warning_cuts_a_long_span_between_words() -> None:
    words = "the committee approved the extraordinarily ambitious reconstruction plan in nineteen ninety"
    span = Span(0, 200, f"{words} {words}", 0.9, 30)
    text = warning_text(Verdict.checked(dec("warn"), DetectionResult(0.9, (span,))), "{spans}")
    quoted = text.strip('"').removesuffix("…")
    assert text.endswith('…"') and len(quoted) < 80
    assert span.text.startswith(quoted + " ")  # ends on a whole word, right before a space


def test_block_action_returns_openai_error() -> None:
    tl = parse_config({"truthlens": {"block_status": 451}}).truthlens
    plan = plan_actions(Verdict.checked(dec("block"), RESULT), dec("block"), tl)
    assert plan.block is not None and plan.warning is None
    assert plan.block.status == 451
    h = headers_dict(plan.block.headers)
    assert h["content-type"] == "application/json" and h["x-truthlens-status"] == "checked"
    error = json.loads(plan.block.body)["error"]
    assert error["type"] == "hallucination_detected"
    assert error["code"] == "truthlens_blocked"
    assert "0.83" in error["message"] and error["param"] is None
    assert error["truthlens"]["score"] == 0.83 and error["truthlens"]["decision"] == "d"
    assert error["truthlens"]["spans"][0] == {"start": 0, "end": 5, "text": "Paris", "score": 0.91, "label": "contradiction"}


@pytest.mark.parametrize("action", ["warn", "block"])
def test_warn_and_block_only_fire_on_checked_and_detected(action: str) -> None:
    not_detected = Verdict.checked(dec(action, threshold=0.95), RESULT)
    unchecked = Verdict.unchecked(dec(action), UncheckedReason.ERROR)
    for verdict in (not_detected, unchecked, Verdict.unverified(dec(action)), Verdict.skipped(dec(action))):
        plan = plan_actions(verdict, dec(action), TL)
        assert plan.warning is None and plan.block is None
        assert headers_dict(plan.headers)["x-truthlens-status"] == str(verdict.status)


def test_none_action_does_nothing() -> None:
    plan = plan_actions(Verdict.checked(dec("none"), RESULT), dec("none"), TL)
    assert plan.headers == () and plan.warning is None and plan.block is None


def test_spans_header_is_bounded() -> None:
    spans = [Span(10**9 + i * 100, 10**9 + i * 100 + 50, "t", 0.5 + (i % 40) / 100, 3, "neutral") for i in range(500)]
    value = spans_header_value(spans)
    assert len(value.encode()) <= SPANS_HEADER_MAX_BYTES
    items = json.loads(value)
    assert 0 < len(items) <= 16
    assert [i[0] for i in items] == sorted(i[0] for i in items)  # answer order
    assert min(i[2] for i in items) >= 0.86  # the highest scores were kept
    small = spans_header_value(spans, max_spans=3, max_bytes=60)
    assert len(small) <= 60 and len(json.loads(small)) == 1  # one 39-byte item fits, two do not
    assert spans_header_value([]) == "[]"


def test_block_response_standalone_builds_headers() -> None:
    verdict = Verdict.checked(dec("block"), RESULT)
    response = block_response(verdict, dec("block"), 422)
    assert response.status == 422 and dict(response.headers)["x-truthlens-score"] == "0.8300"


def test_verdict_status_values_are_distinct() -> None:
    assert {s.value for s in Status} == {"checked", "skipped", "unverified", "unchecked", "disabled"}


def test_block_message_and_body_agree_on_the_decision() -> None:
    """#17: the message said "(decision default)" while the body had decision: null."""
    verdict = Verdict(status=Status.CHECKED, mode="lightweight", score=0.9, detected=True, iterations=1)
    error = json.loads(block_response(verdict, dec("block", name=None), 422, ()).body)["error"]
    assert error["truthlens"]["decision"] is None
    assert error["message"].endswith("(no decision matched: global settings).") and "default" not in error["message"]
    named = json.loads(block_response(verdict, dec("block", name="medical"), 422, ()).body)["error"]
    assert named["truthlens"]["decision"] == "medical" and named["message"].endswith("(decision medical).")
