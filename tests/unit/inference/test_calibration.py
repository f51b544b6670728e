import numpy as np
import pytest

from extproc.evaluation.metrics import auroc
from extproc.inference.calibration import Calibration, CalibrationError, CalibrationSet, fit_platt


def _noisy(seed: int = 0, n: int = 2000):
    """Labels drawn from a known logistic curve on logit(raw): the fit should find it."""
    rng = np.random.default_rng(seed)
    raw = rng.uniform(0.001, 0.999, n)
    true = 1 / (1 + np.exp(-(0.7 * np.log(raw / (1 - raw)) - 1.0)))
    return raw, rng.uniform(size=n) < true


def test_platt_recovers_a_known_curve_and_is_strictly_increasing():
    raw, y = _noisy()
    cal = fit_platt(raw, y, "max_token_prob")
    assert cal.a == pytest.approx(0.7, abs=0.12) and cal.b == pytest.approx(-1.0, abs=0.2)
    grid = np.linspace(0.0, 1.0, 501)
    out = np.array([cal(g) for g in grid])
    assert np.all(np.diff(out) > 0) and out.min() > 0 and out.max() < 1
    assert auroc([cal(r) for r in raw], y) == pytest.approx(auroc(raw, y))  # ranking untouched


def test_a_saturated_raw_score_is_spread_out():
    # raw scores stuck near 1.0 for most answers (the noisy-OR symptom) still map to distinct probabilities
    raw = np.concatenate([1 - np.geomspace(1e-4, 1e-1, 200), np.geomspace(1e-3, 0.5, 200)])
    y = np.concatenate([np.arange(200) % 3 == 0, np.arange(200) % 5 == 0])
    cal = fit_platt(raw, y, "max_token_prob")
    assert cal(0.9999) < 0.9 and cal(0.9999) > cal(0.999) > cal(0.99)


def test_round_trip_and_bad_files_are_named(tmp_path):
    cal = Calibration(0.8, -0.5, "max_token_prob", {"detector": "abc"}, {"sets": ["expertqa"]})
    assert CalibrationSet.load(cal.save(tmp_path)).fits == (cal,)
    stacked = Calibration(0.5, 0.8, "max_token_prob", {"detector": "abc", "surrogate": "def"}, {}, {"context_pmi": 0.4})
    assert CalibrationSet.load(CalibrationSet((cal, stacked)).save(tmp_path)).fits == (cal, stacked)
    (tmp_path / "calibration.json").write_text('{"a": -1, "b": 0, "raw_score": "x"}')
    with pytest.raises(CalibrationError, match="a > 0"):
        CalibrationSet.load(tmp_path / "calibration.json")
    (tmp_path / "calibration.json").write_text('{"b": 0}')
    with pytest.raises(CalibrationError, match="calibration.json"):
        CalibrationSet.load(tmp_path / "calibration.json")
    (tmp_path / "calibration.json").write_text('{"fits": [{"a": 1, "b": 0, "raw_score": "x"}, {"a": 1}]}')
    with pytest.raises(CalibrationError, match=r"fits\[1\]"):
        CalibrationSet.load(tmp_path / "calibration.json")


def test_a_score_that_falls_with_the_label_is_refused():
    raw, y = _noisy()
    with pytest.raises(CalibrationError, match="does not rise"):
        fit_platt(raw, ~y, "max_token_prob")
    with pytest.raises(CalibrationError, match="both classes"):
        fit_platt([0.2, 0.3], [True, True], "max_token_prob")


def test_a_calibration_for_other_model_files_is_refused(tmp_path):
    from extproc.inference.calibration import check_models, file_sha256

    model = tmp_path / "model.onnx"
    model.write_bytes(b"weights v1")
    cal = Calibration(1.0, 0.0, "fused", {"detector": file_sha256(model)})
    check_models(cal, {"detector": model}, "calibration.json")  # same file: fine
    model.write_bytes(b"weights v2")
    with pytest.raises(CalibrationError, match="another detector model"):
        check_models(cal, {"detector": model}, "calibration.json")
    with pytest.raises(CalibrationError, match="explainer model, which is not loaded"):
        check_models(Calibration(1.0, 0.0, "fused", {"explainer": "x"}), {"detector": model}, "calibration.json")


def test_stacking_recovers_a_signal_and_the_set_picks_the_fit_of_the_available_signals():
    rng = np.random.default_rng(1)
    raw = rng.uniform(0.01, 0.99, 3000)
    pmi = rng.normal(0.0, 1.0, 3000)
    z = 0.6 * np.log(raw / (1 - raw)) + 0.9 * pmi - 0.3
    y = rng.uniform(size=3000) < 1 / (1 + np.exp(-z))
    stacked = fit_platt(raw, y, "fused", signals={"context_pmi": pmi})
    assert stacked.a == pytest.approx(0.6, abs=0.1) and stacked.signals["context_pmi"] == pytest.approx(0.9, abs=0.12)
    assert stacked(0.5, {"context_pmi": 1.0}) > stacked(0.5, {"context_pmi": 0.0})  # the signal moves the score
    with pytest.raises(CalibrationError, match="context_pmi"):
        stacked(0.5)  # never silently scored as if the signal were 0
    base = fit_platt(raw, y, "fused")
    both = CalibrationSet((base, stacked))
    assert both.for_signals(frozenset({"context_pmi"}), "fused") is stacked
    assert both.for_signals(frozenset(), "fused") is base  # signal off or failed: the fit made without it
    assert both.for_signals(frozenset({"context_pmi"}), "max_span") is None
    with pytest.raises(CalibrationError, match="one finite value per example"):
        fit_platt(raw, y, "fused", signals={"context_pmi": pmi[:10]})
