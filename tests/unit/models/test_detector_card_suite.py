"""The detector card quotes the real-output suite, baselines beside the model, and the calibration."""

from __future__ import annotations

import json

from models.pipelines.detector.card import real_output_section


def _row(auroc: float) -> dict:
    return {"threshold": 0.5, "sets": {"expertqa": {"test": {"auroc": auroc, "f1": 0.4, "faithful_flagged": 0.2}}}}


def test_card_section_lists_baselines_and_the_models_rows(tmp_path):
    suite = tmp_path / "bench" / "results" / "real-output-suite.json"
    suite.parent.mkdir(parents=True)
    suite.write_text(json.dumps({"sets": {"expertqa": {}}, "candidates": {
        "flag_all": _row(0.5), "context_pmi": _row(0.77), "detector_max": _row(0.61), "detector+verifier": _row(0.63),
        "detector_deep": _row(0.6)}}))
    cal = tmp_path / "models" / "detector" / "calibration.json"
    cal.parent.mkdir(parents=True)
    cal.write_text(json.dumps({"a": 0.4, "b": 0.0, "fitted_on": {"answers": 360, "sets": ["expertqa"],
                                                                  "recommended_response_threshold": 0.51}}))
    text = "\n".join(real_output_section("models/detector", suite))
    assert "context_pmi | 0.770" in text and "detector+verifier | 0.630" in text
    assert "detector_deep" not in text  # another detector's rows stay on its own card
    assert "thresholds.response: 0.51" in text
    assert real_output_section("models/detector", tmp_path / "absent.json") == []
