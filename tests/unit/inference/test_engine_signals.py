"""The fused score with the surrogate's context PMI: bundled models, the committed calibration, missing signals.

Runs the real bundled detector / explainer and the SmolLM2 surrogate the dev setup builds
(models/surrogate), so it checks the shipped wiring, not a stand-in.
"""

import math
from pathlib import Path

import pytest

from extproc.inference.engine import CONTEXT_PMI, EngineSettings, build_engine
from tests.helpers.settings import engine_settings

ROOT = Path(__file__).resolve().parents[3]
PASSAGE = ("The Eiffel Tower is a wrought-iron lattice tower in Paris. It was completed in 1889 and is 330 metres "
           "tall. It was designed by the engineering company of Gustave Eiffel.")
QUESTION = "When was the Eiffel Tower completed and how tall is it?"
ANSWER = "The Eiffel Tower was completed in 1889. It is 330 metres tall."


def _settings(**kw) -> EngineSettings:
    base = dict(sentinel_dir=None, detector_dir=str(ROOT / "models/detector"), explainer_dir=str(ROOT / "models/explainer"),
                surrogate_dir=str(ROOT / "models/surrogate"), provider="cpu", strict=True)
    return engine_settings(**{**base, **kw})


@pytest.fixture(scope="module")
def surrogate_built() -> None:
    if not (ROOT / "models/surrogate/model.onnx").is_file():
        pytest.fail("models/surrogate is missing: `make setup-dev` builds it (truthlens export --task causal-lm)")


@pytest.mark.parametrize("detector", ["models/detector", "models/detector-full"])  # the CPU default, the 6-layer tier
async def test_the_score_stacks_context_pmi_with_the_committed_fit(surrogate_built, detector):
    on = build_engine(_settings(detector_dir=str(ROOT / detector)))
    off = build_engine(_settings(detector_dir=str(ROOT / detector), context_pmi=False))
    try:
        assert on.signals == frozenset({CONTEXT_PMI})
        result = await on.detect([PASSAGE], QUESTION, ANSWER)
        plain = await off.detect([PASSAGE], QUESTION, ANSWER)
        pmi = on.surrogate.context_pmi([PASSAGE], QUESTION, ANSWER)
    finally:
        await on.close()
        await off.close()
    assert result.signals == ("detector", "verifier", CONTEXT_PMI) and plain.signals == ("detector", "verifier")
    stacked = on.calibration.for_signals(frozenset({CONTEXT_PMI}), "fused")
    base = on.calibration.for_signals(frozenset(), "fused")
    assert stacked is not base and set(stacked.signals) == {CONTEXT_PMI} and not base.signals
    # recover the worst sentence's raw doubt from the unstacked score, then stack it by hand
    logit_doubt = (math.log(plain.score / (1 - plain.score)) - base.b) / base.a
    doubt = 1 / (1 + math.exp(-logit_doubt))
    assert result.score == pytest.approx(stacked(doubt, {CONTEXT_PMI: -pmi.mean}), abs=1e-4)
    assert pmi.mean > 0.5  # the passage explains this answer: the signal says grounded


async def test_signal_off_or_failing_falls_back_to_the_fit_without_it(surrogate_built, monkeypatch):
    off = build_engine(_settings(context_pmi=False))
    on = build_engine(_settings())
    try:
        assert off.surrogate is None and off.signals == frozenset()
        base = await off.detect([PASSAGE], QUESTION, ANSWER)

        def broken(*_args, **_kw):
            raise RuntimeError("onnxruntime fell over")

        monkeypatch.setattr(on.surrogate, "read", broken)
        failed = await on.detect([PASSAGE], QUESTION, ANSWER)
    finally:
        await off.close()
        await on.close()
    assert base.signals == failed.signals == ("detector", "verifier")
    assert failed.score == pytest.approx(base.score)  # scored by the fit made without the signal, not as if it were 0


async def test_a_calibration_for_another_surrogate_is_refused(surrogate_built, tmp_path):
    import json
    import shutil

    det = tmp_path / "detector"
    shutil.copytree(ROOT / "models/detector", det)
    data = json.loads((det / "calibration.json").read_text())
    for fit in data["fits"]:
        if "surrogate" in fit["models"]:
            fit["models"]["surrogate"] = "0" * 64
    (det / "calibration.json").write_text(json.dumps(data))
    lenient = build_engine(_settings(detector_dir=str(det), strict=False))
    try:
        assert lenient.calibration is None and "another surrogate model" in lenient.load_errors["calibration"]
        assert lenient.signals == frozenset()
    finally:
        await lenient.close()
    without = build_engine(_settings(detector_dir=str(det), surrogate_dir=None, strict=True))
    try:  # with no surrogate loaded, its fit is simply not used: the base fit still serves
        assert without.calibration is not None and [len(c.signals) for c in without.calibration.fits] == [0]
    finally:
        await without.close()


async def test_lumina_signals_join_when_a_fit_uses_them_and_mmd_waits_for_the_reservoir(surrogate_built, tmp_path):
    import json
    import shutil

    from extproc.inference.engine import CONTEXT_MMD, LENS_EMERGENCE

    det = tmp_path / "detector"
    shutil.copytree(ROOT / "models/detector", det)
    data = json.loads((det / "calibration.json").read_text())
    stacked = next(f for f in data["fits"] if f["signals"])
    lens_only = {**stacked, "signals": {**stacked["signals"], LENS_EMERGENCE: -0.5}}
    everything = {**stacked, "signals": {**stacked["signals"], LENS_EMERGENCE: -0.5, CONTEXT_MMD: -1.0}}
    (det / "calibration.json").write_text(json.dumps({"fits": [*data["fits"], lens_only, everything]}))
    engine = build_engine(_settings(detector_dir=str(det), lens_emergence=True, context_mmd=True))
    try:
        assert engine.signals == frozenset({CONTEXT_PMI, LENS_EMERGENCE, CONTEXT_MMD})
        first = await engine.detect([PASSAGE], QUESTION, ANSWER)  # nobody else's passages yet: no MMD
        second = await engine.detect(["Bananas are rich in potassium."], "Are bananas healthy?",
                                     "Bananas are rich in potassium.")
    finally:
        await engine.close()
    assert first.signals == ("detector", "verifier", CONTEXT_PMI, LENS_EMERGENCE)
    assert second.signals == ("detector", "verifier", CONTEXT_MMD, CONTEXT_PMI, LENS_EMERGENCE)


async def test_a_request_can_turn_the_signals_off(surrogate_built, monkeypatch):
    engine = build_engine(_settings())
    calls = []
    real = engine.surrogate.read
    monkeypatch.setattr(engine.surrogate, "read", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    try:
        off = await engine.detect([PASSAGE], QUESTION, ANSWER, signals=frozenset())
        on = await engine.detect([PASSAGE], QUESTION, ANSWER, signals=frozenset({CONTEXT_PMI}))
    finally:
        await engine.close()
    assert off.signals == ("detector", "verifier") and on.signals == ("detector", "verifier", CONTEXT_PMI)
    assert len(calls) == 1  # the surrogate read only the answer that was allowed its signal
