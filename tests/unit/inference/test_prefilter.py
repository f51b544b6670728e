"""The sentinel's lexical prefilter: features, persistence, validation, and the engine's fast path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from extproc.inference.engine import build_engine
from extproc.inference.manifest import ManifestError
from extproc.inference.prefilter import PREFILTER_FILE, LexicalPrefilter, PrefilterBand, feature_indices, feature_keys
from tests.helpers.settings import engine_settings

REPO = Path(__file__).resolve().parents[3]


def test_features_are_words_pairs_opening_and_length_and_ignore_case():
    keys = feature_keys("Who wrote Hamlet?")
    assert keys == {"who", "wrote", "hamlet", "?", "who wrote", "wrote hamlet", "hamlet ?", "^who", "^^who wrote",
                    "#len0"}
    assert feature_keys("WHO WROTE HAMLET?") == keys
    assert feature_keys("write a poem") != feature_keys("write a song")
    assert feature_keys("") == feature_keys("   ") == {"#empty"}
    assert "#len7" in feature_keys("x " * 500)  # long prompts: first 48 words, top length bucket


def test_features_do_not_depend_on_the_process_hash_seed():
    """Training and serving run in different processes: nothing may depend on Python's salted hash()."""
    code = ("import sys; from extproc.inference.prefilter import feature_keys; "
            "print(sorted(feature_keys('Who wrote Hamlet? Write a poem.')))")
    outs = {subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1 and outs.pop().startswith("[")


def _prefilter(lo: float = 0.01, hi: float = 0.99) -> LexicalPrefilter:
    """Hand-set weights: 'poem' strongly non-factual, 'who' strongly factual."""
    return LexicalPrefilter({"poem": -5.0, "^poem": -1.0, "who": 5.0, "^who": 1.0}, 0.0, PrefilterBand(lo, hi),
                            {"note": "test"})


def test_serving_scores_what_training_computes():
    """Serving sums dict lookups over string features; training indexes a dense vector: one probability."""
    rng = np.random.default_rng(0)
    vocab = sorted(set().union(*(feature_keys(t) for t in (
        "Who wrote Hamlet?", "Write a poem about the sea, please.", "x " * 500, "When was Bach born?"))))
    w = np.where(rng.random(len(vocab)) < 0.7, rng.normal(0, 2, len(vocab)), 0).astype(np.float32)
    pre = LexicalPrefilter.from_vocabulary(vocab, w, -0.25, PrefilterBand(0.01, 0.99), {})
    index = {k: i for i, k in enumerate(vocab)}
    for text in ("Who wrote Hamlet?", "Write a poem about the sea, please.", "", "x " * 500, "an unseen prompt"):
        z = float(w[feature_indices(text, index)].astype(np.float64).sum()) - 0.25
        assert pre.probability(text) == pytest.approx(1 / (1 + np.exp(-z)), rel=1e-6, abs=1e-9)


def test_decide_answers_only_outside_the_band():
    pre = _prefilter()
    assert pre.decide("poem")[0] is False
    assert pre.decide("who")[0] is True
    decided, p = pre.decide("something neutral entirely")
    assert decided is None and p == 0.5  # no feature known: the bias alone


def test_save_load_roundtrip(tmp_path: Path):
    pre = _prefilter(0.02, 0.97)
    pre.save(tmp_path)
    back = LexicalPrefilter.load(tmp_path)
    assert back.band == PrefilterBand(0.02, 0.97) and back.weights == pre.weights  # these weights are exact in fp16
    for text in ("poem", "who", "something neutral"):
        assert back.probability(text) == pytest.approx(pre.probability(text), abs=2e-3)
    assert back.meta["note"] == "test"


@pytest.mark.parametrize("band", [(0.6, 0.9), (0.1, 0.4), (-0.1, 0.9), (0.1, 1.5)])
def test_band_must_straddle_one_half(band):
    with pytest.raises(ValueError, match="prefilter band"):
        PrefilterBand(*band)


def _rewrite(path: Path, **changes) -> None:
    with np.load(path / PREFILTER_FILE) as data:
        arrays = {k: data[k] for k in data.files}
    arrays.update(changes)
    with (path / PREFILTER_FILE).open("wb") as fh:
        np.savez(fh, **arrays)


def test_load_errors_say_what_is_wrong(tmp_path: Path):
    (tmp_path / PREFILTER_FILE).write_bytes(b"not an npz")
    with pytest.raises(ManifestError, match="not a TruthLens prefilter file"):
        LexicalPrefilter.load(tmp_path)
    _prefilter().save(tmp_path)
    _rewrite(tmp_path, meta=np.array('{"features": "word-uni-bi-crc32-v1", "buckets": 4096}'))
    with pytest.raises(ManifestError, match="features 'word-uni-bi-crc32-v1'.*retrain"):
        LexicalPrefilter.load(tmp_path)
    _prefilter().save(tmp_path)
    _rewrite(tmp_path, values=np.array([1.0], dtype=np.float16))
    with pytest.raises(ManifestError, match="1 weights for 4 features"):
        LexicalPrefilter.load(tmp_path)


@pytest.fixture
def sentinel_with_prefilter(tiny_models, tmp_path: Path) -> Path:
    d = tmp_path / "sentinel"
    shutil.copytree(tiny_models["bert-seq"], d)
    _prefilter().save(d)
    return d


async def test_engine_decides_confident_prompts_without_the_model(sentinel_with_prefilter):
    engine = build_engine(engine_settings(sentinel_dir=str(sentinel_with_prefilter), provider="cpu"))
    try:
        r = engine.prefilter_prompt("poem")
        assert r is not None and r.by == "prefilter" and not r.needs_check
        assert (await engine.classify_prompt("who")).by == "prefilter"
        assert engine._batchers["sentinel"].batches == 0  # no forward pass so far
        unsure = await engine.classify_prompt("something neutral entirely")
        assert unsure.by == "model" and engine._batchers["sentinel"].batches == 1
        assert engine.prefilter_prompt("something neutral entirely") is None
        # a caller that already asked the prefilter skips it: the model answers even a sure prompt
        again = await engine.classify_prompt("who", prefiltered=True)
        assert again.by == "model" and engine._batchers["sentinel"].batches == 2
    finally:
        await engine.close()


async def test_prefilter_can_be_switched_off(sentinel_with_prefilter):
    engine = build_engine(engine_settings(sentinel_dir=str(sentinel_with_prefilter), provider="cpu",
                                         sentinel_prefilter=False))
    try:
        assert engine.prefilter is None and engine.prefilter_prompt("poem") is None
        assert (await engine.classify_prompt("poem")).by == "model"
    finally:
        await engine.close()


async def test_broken_prefilter_costs_only_the_fast_path(sentinel_with_prefilter, caplog):
    (sentinel_with_prefilter / PREFILTER_FILE).write_bytes(b"garbage")
    engine = build_engine(engine_settings(sentinel_dir=str(sentinel_with_prefilter), provider="cpu"))
    try:
        assert engine.has("sentinel") and engine.prefilter is None
        assert "truthlens.models.sentinel" in engine.load_errors["sentinel_prefilter"]
        assert (await engine.classify_prompt("poem")).by == "model"
    finally:
        await engine.close()
    with pytest.raises(ManifestError, match="truthlens.models.sentinel: .*prefilter"):
        build_engine(engine_settings(sentinel_dir=str(sentinel_with_prefilter), provider="cpu", strict=True))


def test_bundled_prefilter_loads_and_knows_the_obvious_cases():
    pre = LexicalPrefilter.load(REPO / "models" / "sentinel")
    assert pre.band.non_factual_below <= 0.01 and pre.band.factual_above >= 0.99
    assert pre.decide("Write a short poem about the sea.")[0] is False
    assert pre.decide("Write a Python function that reverses a linked list.")[0] is False
    p_factual = pre.probability("When was the Eiffel Tower built?")
    assert p_factual > 0.5  # a factoid question leans factual even when it is left to the model
