"""Where eval/detect take models and thresholds from, and how a failing example is reported."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from extproc.config import default_config
from extproc.evaluation.dataset import parse_jsonl
from extproc.evaluation.scorer import Scorer, ScorerError, settings_from_args


def _args(**kw: object) -> argparse.Namespace:
    base = {"config": None, "model_dir": None, "explainer_dir": None, "no_explainer": False,
            "token_threshold": None, "min_span_confidence": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_defaults_without_config() -> None:
    settings, response = settings_from_args(_args())
    assert settings.detector_dir == "models/detector" and settings.explainer_dir == "models/explainer"
    thresholds = default_config().truthlens.thresholds  # no --config: the project's defaults
    assert settings.sentinel_dir is None and settings.token_threshold == thresholds.token
    assert response == thresholds.response


def test_config_supplies_dirs_and_thresholds_and_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "tl.yaml"
    cfg.write_text(
        "truthlens:\n  models: {detector: /m/det, explainer: /m/exp}\n"
        "  thresholds: {token: 0.3, response: 0.7, nli_entailment: 0.8}\n"
    )
    settings, response = settings_from_args(_args(config=str(cfg)))
    assert (settings.detector_dir, settings.explainer_dir) == ("/m/det", "/m/exp")
    assert settings.token_threshold == 0.3 and settings.nli_entailment_threshold == 0.8 and response == 0.7
    settings, _ = settings_from_args(_args(config=str(cfg), model_dir="/other", no_explainer=True))
    assert settings.detector_dir == "/other" and settings.explainer_dir is None and not settings.explainer_enabled


def test_threshold_flags_override_config_and_are_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "tl.yaml"
    cfg.write_text("truthlens:\n  thresholds: {token: 0.3, min_span_confidence: 0.6}\n")
    settings, _ = settings_from_args(_args(config=str(cfg), token_threshold=0.15, min_span_confidence=0.15))
    assert settings.token_threshold == 0.15 and settings.min_span_confidence == 0.15
    with pytest.raises(ScorerError, match="--token-threshold: expected a probability"):
        settings_from_args(_args(token_threshold=1.5))


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "tl.yaml"
    cfg.write_text("truthlens:\n  thresholds: {token: 2}\n")
    with pytest.raises(ScorerError, match="truthlens.thresholds.token"):
        settings_from_args(_args(config=str(cfg)))


def test_a_failing_example_is_named(tiny_models) -> None:  # type: ignore[no-untyped-def]
    settings, response = settings_from_args(_args(model_dir=str(tiny_models["bert-token"]), no_explainer=True))
    scorer = Scorer(settings, response)
    try:
        (ex,) = parse_jsonl('{"id": "x1", "context": "a b", "question": null, "answer": "a c", "labels": []}')
        pred = scorer.score(ex)  # the real path works and exposes the detector's token evidence
        assert len(pred.token_offsets) == len(pred.token_probs) > 0

        async def broken(*_: object) -> None:
            raise RuntimeError("boom")

        scorer.engine.detect = broken  # type: ignore[method-assign]
        with pytest.raises(ScorerError, match=r"example 'x1' \(line 1\): detector failed: RuntimeError: boom"):
            scorer.score(ex)
    finally:
        scorer.close()


def test_an_example_over_the_request_budget_is_unchecked_not_the_end_of_the_run(tiny_models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """As the gateway passes it unchecked/too_large: not flagged, score 0, counted in the report."""
    from extproc.evaluation.runner import evaluate, prediction_record

    cfg = tmp_path / "tl.yaml"
    cfg.write_text("truthlens:\n  batching: {max_request_tokens: 512}\n  models: {surrogate: null}\n")
    settings, response = settings_from_args(_args(config=str(cfg), model_dir=str(tiny_models["bert-token"]),
                                                   no_explainer=True))
    scorer = Scorer(settings, response)
    try:
        long_context = " ".join(["the tower is tall"] * 400)
        big, small = parse_jsonl(
            f'{{"id": "big", "context": "{long_context}", "question": null, "answer": "a c", "labels": [{{"start": 0, "end": 1}}]}}\n'
            '{"id": "small", "context": "a b", "question": null, "answer": "a c", "labels": []}')
        scorer.warm_up(big)  # the first example may be the large one: warming up does not fail either
        pred = scorer.score(big)
        assert pred.unchecked == "too_large" and pred.score == 0.0 and pred.spans == ()
        assert prediction_record(big, pred)["unchecked"] == "too_large"
        assert scorer.score(small).unchecked is None
        report = evaluate([big, small], scorer.score, scorer.token_threshold)
        assert report["examples"] == 2 and report["unchecked"] == {"too_large": 1}
        assert report["example_level"]["fn"] == 1  # the unchecked hallucinated answer is a miss, as users see it
    finally:
        scorer.close()
