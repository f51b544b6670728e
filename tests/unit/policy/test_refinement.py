"""The standard-mode acceptance rules (extproc/policy/refinement.py) and premium's score (#17)."""

from __future__ import annotations

import pytest

from extproc.inference.api import DetectionResult, Span
from extproc.policy.actions import response_headers
from extproc.policy.decisions import Decision
from extproc.policy.refinement import better, content_words, rewrite_problem
from extproc.policy.verdict import Verdict, cross_check_score, verdict_payload

QUESTION = "When did the Eiffel Tower open?"
ORIGINAL = "The Eiffel Tower opened in 1889. It was designed by engineers from Oslo."


@pytest.mark.parametrize(("rewrite", "reason"), [
    # what a small LLM (SmolLM2) wrote when asked to rewrite (issue #17)
    ("It is currently not possible to determine the exact date of the opening.", "refusal"),
    ("I made a change to the original context: the tower opened in 1889.", "meta_text"),
    ("[Rewite] The Eiffel Tower opened in 1889.", "artefact"),
    # and their relatives
    ("I'm sorry, I can\u2019t answer that.", "refusal"),
    ("The opening date cannot be determined.", "refusal"),
    ("The documents do not contain any information about the opening.", "refusal"),
    ("I don't know when it opened.", "refusal"),
    ("According to the provided context, it opened in 1889.", "meta_text"),
    ("Based on the context, the tower opened in 1889.", "meta_text"),
    ("Here is the corrected answer: the tower opened in 1889.", "meta_text"),
    ("As an AI, I note the tower opened in 1889.", "meta_text"),
    ("The tower opened in 1889. [Answer]", "artefact"),
    ("The tower opened in 1889.<|im_end|>", "artefact"),
    ("Bananas are yellow.", "off_topic"),
    ("", "empty"),
    ("  \n", "empty"),
    (None, "empty"),
])
def test_bad_rewrites_are_rejected_with_their_reason(rewrite: str | None, reason: str) -> None:
    assert rewrite_problem(QUESTION, ORIGINAL, rewrite) == reason


@pytest.mark.parametrize("rewrite", [
    "The Eiffel Tower opened in 1889.",
    "It opened in 1889.",  # shares no word with the question, but with the original answer
    "In the context of the 1889 World's Fair, the Eiffel Tower opened that year [1].",  # citation, idiom
    "The tower opened in 1889; see [the fair's history](https://example.com) and towers[i] for more.",
    "The documents of the fair say the tower opened in 1889.",
])
def test_good_rewrites_pass(rewrite: str) -> None:
    assert rewrite_problem(QUESTION, ORIGINAL, rewrite) is None


def test_a_phrase_the_original_already_had_does_not_count() -> None:
    original = "According to the provided context, the tower opened in 1889 and was built in Oslo."
    assert rewrite_problem(QUESTION, original, "According to the provided context, the tower opened in 1889.") is None
    assert rewrite_problem(QUESTION, original, "I made a change: the tower opened in 1889.") == "meta_text"


def test_only_a_strictly_lower_score_is_better() -> None:
    assert better(0.3, 0.9)
    assert not better(0.9, 0.9)
    assert not better(0.95, 0.9)


def test_content_words_drop_stopwords_and_fold_plurals() -> None:
    assert content_words("How tall are the towers in 2024?") == {"tall", "tower", "2024"}


DECISION = Decision(None, True, "premium", 0.65, "header")
SPAN = Span(start=0, end=5, text="Oslo.", score=0.9, tokens=2)


def test_cross_check_score_without_a_confirmed_span_stays_under_the_threshold() -> None:
    assert cross_check_score(0.9, 0.8, True, 0.65) == 0.8  # the lower of the two
    assert cross_check_score(0.9, 0.8, False, 0.65) == 0.6499  # below the threshold at the header's precision
    assert cross_check_score(0.3, 0.8, False, 0.65) == 0.3
    assert cross_check_score(0.9, 0.9, False, 0.57) == 0.5699
    assert cross_check_score(0.9, 0.9, False, 0.0) == 0.0


@pytest.mark.parametrize(("threshold", "spans", "detected"), [(0.65, (), False), (0.0, (), False), (0.65, (SPAN,), True)])
def test_premium_detected_needs_a_span(threshold: float, spans: tuple[Span, ...], detected: bool) -> None:
    decision = Decision(None, True, "premium", threshold, "header")
    score = cross_check_score(0.9, 0.9, bool(spans), threshold)
    v = Verdict.checked(decision, DetectionResult(score=score, spans=spans), iterations=2, require_spans=True)
    assert v.detected is detected
    assert v.detected == bool(v.spans)


def test_mitigation_facts_in_headers_and_payload() -> None:
    base = Verdict.checked(Decision(None, True, "standard", 0.65, "header"), DetectionResult(score=0.9, spans=(SPAN,)))
    assert not any(k in dict(response_headers(base)) for k in (
        "x-truthlens-refined", "x-truthlens-original-score", "x-truthlens-verifiers"))
    kept = Verdict(**{**{f: getattr(base, f) for f in base.__slots__}, "original_score": 0.9, "refined": False,
                      "refine_rejected": ("refusal",)})
    h = dict(response_headers(kept))
    assert (h["x-truthlens-refined"], h["x-truthlens-original-score"], h["x-truthlens-refine-rejected"]) == (
        "false", "0.9000", "refusal")
    assert verdict_payload(kept)["refined"] is False and verdict_payload(kept)["refine_rejected"] == ["refusal"]
    checked = Verdict.checked(DECISION, DetectionResult(score=0.2, spans=()), iterations=2, require_spans=True)
    premium = Verdict(**{**{f: getattr(checked, f) for f in checked.__slots__}, "original_score": 0.9,
                         "verifiers": (1, 2)})
    h = dict(response_headers(premium))
    assert (h["x-truthlens-verifiers"], h["x-truthlens-original-score"]) == ("1/2", "0.9000")
    assert "x-truthlens-refined" not in h
    assert verdict_payload(premium)["verifiers"] == {"answered": 1, "asked": 2}


def test_block_body_carries_the_mitigation_facts() -> None:
    import json

    from extproc.policy.actions import block_response

    decision = Decision("medical", True, "standard", 0.5, "block")
    checked = Verdict.checked(decision, DetectionResult(score=0.9, spans=(SPAN,)))
    kept = Verdict(**{**{f: getattr(checked, f) for f in checked.__slots__}, "original_score": 0.9, "refined": False,
                      "refine_rejected": ("refusal",)})
    body = json.loads(block_response(kept, decision, 422).body)["error"]["truthlens"]
    assert (body["original_score"], body["refined"], body["refine_rejected"]) == (0.9, False, ["refusal"])
    plain = json.loads(block_response(checked, decision, 422).body)["error"]["truthlens"]
    assert "refined" not in plain and "verifiers" not in plain
