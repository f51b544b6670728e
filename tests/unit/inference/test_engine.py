import asyncio
import shutil

import numpy as np
import pytest

from extproc.inference.api import DetectionResult, ModelUnavailable
from extproc.inference.engine import EngineSettings, build_engine
from extproc.inference.manifest import ManifestError
from extproc.inference.models import Detector, NliResult, OnnxModel
from extproc.inference.runtime import RuntimeOptions
from extproc.inference.spans import answer_sentences
from extproc.inference.windowing import PairInput, Row
from tests.helpers.settings import engine_settings

LONG_CONTEXT = ["Paris is the capital of France. " * 40, "The Eiffel tower was built in 1889."]
ANSWER = "The capital of France is Lyon. The tower was built in 1925."


def _settings(tiny_models, detector="bert-token", **kw) -> EngineSettings:
    base = dict(sentinel_dir=str(tiny_models["bert-seq"]), detector_dir=str(tiny_models[detector]),
                explainer_dir=str(tiny_models["bert-nli"]), provider="cpu", max_wait_ms=1.0)
    return engine_settings(**{**base, **kw})


@pytest.fixture
async def engine_factory(tiny_models):
    engines = []

    def make(**kw):
        engines.append(build_engine(_settings(tiny_models, **kw)))
        return engines[-1]

    yield make
    for e in engines:
        await e.close()


@pytest.mark.parametrize("detector", ["bert-token", "modernbert-token"])
async def test_detect_windows_long_context_and_scores_the_answer(engine_factory, detector):
    # token threshold 0 flags every token: the whole answer must come back as spans.
    engine = engine_factory(detector=detector, token_threshold=0.0, min_span_confidence=0.0,
                            min_span_chars=1, explainer_enabled=False)
    result = await engine.detect(LONG_CONTEXT, "What is the capital?", ANSWER)
    assert isinstance(result, DetectionResult)
    assert result.windows > 1
    assert result.spans and all(ANSWER[s.start:s.end] == s.text for s in result.spans)
    assert result.spans[0].start == 0 and result.spans[-1].end == len(ANSWER)
    assert 0.0 < result.score <= 1.0
    assert set(result.timings_ms) >= {"tokenize", "detector"}


async def test_token_threshold_one_flags_nothing(engine_factory):
    engine = engine_factory(token_threshold=1.0, score_method="noisy_or")
    result = await engine.detect(LONG_CONTEXT, None, ANSWER)
    assert result.spans == () and result.score == 0.0


async def test_explainer_labels_spans_and_drops_entailed_ones(engine_factory):
    flag_all = dict(token_threshold=0.0, min_span_confidence=0.0, min_span_chars=1, score_method="noisy_or")
    keep = await engine_factory(nli_entailment_threshold=1.0, **flag_all).detect(LONG_CONTEXT, "q", ANSWER)
    assert keep.spans and keep.dropped_spans == 0
    for span in keep.spans:
        assert span.nli_label in {"entailment", "neutral", "contradiction"}
        assert span.severity == {"contradiction": 4, "neutral": 2, "entailment": 1}[span.nli_label]
        assert 0.0 <= span.nli_confidence <= 1.0
    assert "explainer" in keep.timings_ms
    drop = await engine_factory(nli_entailment_threshold=0.0, **flag_all).detect(LONG_CONTEXT, "q", ANSWER)
    assert drop.spans == () and drop.dropped_spans == len(keep.spans) and drop.score == 0.0
    off = await engine_factory(nli_entailment_threshold=0.0, drop_entailed=False, **flag_all).detect(LONG_CONTEXT, "q", ANSWER)
    assert len(off.spans) == len(keep.spans) and off.dropped_spans == 0


def _fixed_verifier(engine, *verdicts):
    """The verifier's answers per sentence, fixed (the tiny NLI model's are random)."""
    async def verify(context, sentences, budget=None, prepared=None):
        assert len(sentences) == len(verdicts)
        return list(verdicts)
    engine._verify = verify
    return engine


async def test_fused_verifies_every_sentence_and_flags_by_sentence(engine_factory):
    lyon, tower = NliResult("contradiction", 0.9, 0.05), NliResult("entailment", 0.999, 0.999)
    engine = _fixed_verifier(engine_factory(response_threshold=0.2), lyon, tower)
    result = await engine.detect(LONG_CONTEXT, "q", ANSWER)
    first_end = ANSWER.index(".") + 1
    tokens = engine.detector.predict(LONG_CONTEXT, "q", ANSWER)
    inside = max(p for (a, b), p in zip(tokens.offsets, tokens.probs) if b > a and a < first_end)
    assert (inside * 0.95) ** 0.5 > 0.2 > (1.0 * 0.001) ** 0.5  # the tiny detector's tokens are not near 0
    assert result.spans and all(s.end <= first_end for s in result.spans)  # only the contradicted sentence
    assert {s.nli_label for s in result.spans} == {"contradiction"}
    assert "verifier" in result.timings_ms
    assert result.score == pytest.approx((inside * 0.95) ** 0.5, abs=1e-5)  # sqrt(token max x (1 - P(ent)))
    strict = await _fixed_verifier(engine_factory(response_threshold=1.0), lyon, tower).detect(LONG_CONTEXT, "q", ANSWER)
    assert strict.spans == () and strict.score == pytest.approx(result.score)


async def test_a_flagged_sentence_is_never_labelled_entailment(engine_factory):
    weak = NliResult("entailment", 0.4, 0.4)  # top label entailment, yet not much support
    engine = _fixed_verifier(engine_factory(response_threshold=0.0), weak, weak)
    result = await engine.detect(LONG_CONTEXT, "q", ANSWER)
    assert result.spans and {s.nli_label for s in result.spans} == {"neutral"}
    assert all(s.nli_confidence == pytest.approx(0.6) for s in result.spans)


async def test_fused_flags_a_doubted_sentence_even_without_flagged_tokens(engine_factory):
    doubt = NliResult("neutral", 0.9, 0.0)
    engine = _fixed_verifier(engine_factory(response_threshold=0.0, token_threshold=1.0), doubt, doubt)
    result = await engine.detect(LONG_CONTEXT, "q", ANSWER)
    assert [s.text for s in result.spans] == ["The capital of France is Lyon.", "The tower was built in 1925."]


async def test_calibration_maps_the_score_and_must_match_the_models(engine_factory, tiny_models, tmp_path):
    from extproc.inference.calibration import Calibration, file_sha256

    det = tmp_path / "det"
    shutil.copytree(tiny_models["bert-token"], det)
    raw = await engine_factory(score_method="max_span", explainer_enabled=False, token_threshold=0.0,
                               min_span_confidence=0.0).detect(LONG_CONTEXT, "q", ANSWER)
    Calibration(2.0, -1.0, "max_span", {"detector": file_sha256(det / "model.onnx")}).save(det)
    engine = engine_factory(detector_dir=str(det), score_method="max_span", explainer_enabled=False,
                            token_threshold=0.0, min_span_confidence=0.0)
    assert engine.calibration is not None
    cal = await engine.detect(LONG_CONTEXT, "q", ANSWER)
    (fit,) = engine.calibration.fits
    assert cal.score == pytest.approx(fit(raw.score), abs=1e-5) and cal.score != pytest.approx(raw.score)
    Calibration(2.0, -1.0, "max_span", {"detector": "0" * 64}).save(det)
    stale = engine_factory(detector_dir=str(det), score_method="max_span", explainer_enabled=False)
    assert stale.calibration is None and "another detector model" in stale.load_errors["calibration"]
    with pytest.raises(ManifestError, match="truthlens.models.detector"):
        build_engine(_settings(tiny_models, detector_dir=str(det), strict=True))


async def test_score_method_is_selectable(engine_factory):
    flag_all = dict(token_threshold=0.0, min_span_confidence=0.0, min_span_chars=1, explainer_enabled=False)
    noisy = await engine_factory(score_method="noisy_or", **flag_all).detect(LONG_CONTEXT, "q", ANSWER)
    best = await engine_factory(score_method="max_span", **flag_all).detect(LONG_CONTEXT, "q", ANSWER)
    assert best.score == pytest.approx(max(s.score for s in best.spans))
    assert noisy.score >= best.score


async def test_sentinel_threshold(engine_factory):
    always = await engine_factory(sentinel_threshold=0.0).classify_prompt("What is the dose of aspirin?")
    never = await engine_factory(sentinel_threshold=1.0).classify_prompt("What is the dose of aspirin?")
    assert always.needs_check and not never.needs_check
    assert always.confidence == pytest.approx(never.confidence) and 0.0 < always.confidence < 1.0


async def test_concurrent_requests_share_batches_and_match_sequential_results(engine_factory):
    engine = engine_factory(token_threshold=0.0, min_span_confidence=0.0, min_span_chars=1, explainer_enabled=False)
    answers = [f"The tower was built in {1880 + i}." for i in range(12)]
    alone = [await engine.detect(["The Eiffel tower was built in 1889."], None, a) for a in answers]
    together = await asyncio.gather(*[engine.detect(["The Eiffel tower was built in 1889."], None, a) for a in answers])
    for x, y in zip(alone, together):
        assert [(s.start, s.end) for s in x.spans] == [(s.start, s.end) for s in y.spans]
        assert x.score == pytest.approx(y.score, abs=1e-5)  # padding to a longer batch must not change results


async def test_missing_models_are_reported_not_fatal(tiny_models, tmp_path):
    engine = build_engine(engine_settings(detector_dir=str(tmp_path / "absent"), sentinel_dir=None, explainer_dir=None))
    try:
        assert not engine.has("detector") and engine.models() == ()
        with pytest.raises(ModelUnavailable):
            await engine.detect(["c"], "q", "a")
        with pytest.raises(ModelUnavailable):
            await engine.classify_prompt("p")
    finally:
        await engine.close()


async def test_partial_engine_reports_roles_and_providers(tiny_models):
    engine = build_engine(engine_settings(detector_dir=str(tiny_models["modernbert-token"]), provider="cpu"))
    try:
        assert engine.has("detector") and not engine.has("sentinel") and not engine.has("explainer")
        (info,) = engine.models()
        assert (info.role, info.name, info.provider) == ("detector", "modernbert-token", "CPUExecutionProvider")
    finally:
        await engine.close()


async def test_detector_auto_serves_the_quality_tier_only_where_its_session_runs_on_cuda(tiny_models, tmp_path,
                                                                                        monkeypatch):
    """`models.detector: auto` (detector_dir + gpu_detector_dir): on a GPU the quality tier's session must really
    run on CUDA; anywhere else, and without its directory, the CPU tier serves."""
    from extproc.inference import engine as engine_mod, runtime

    cpu_tier, quality = str(tiny_models["bert-token"]), tmp_path / "quality"
    shutil.copytree(tiny_models["modernbert-token"], quality)

    async def served(**kw) -> str:
        engine = build_engine(engine_settings(**{"detector_dir": cpu_tier, "gpu_detector_dir": str(quality),
                                                 "provider": "auto", **kw}))
        try:
            return next(m.path for m in engine.models() if m.role == "detector")
        finally:
            await engine.close()

    assert await served() == cpu_tier  # this CPU-only onnxruntime build: the quality tier is not even opened
    monkeypatch.setattr(runtime.ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    assert await served() == cpu_tier  # a CUDA build whose session still lands on the CPU (no GPU)
    monkeypatch.setattr(engine_mod.OnnxModel, "provider",
                        property(lambda m: runtime.CUDA if m.path == quality else runtime.CPU))  # as on a GPU
    assert await served() == str(quality)
    assert await served(provider="cpu") == cpu_tier
    assert await served(gpu_detector_dir=str(tmp_path / "absent")) == cpu_tier
    (quality / "truthlens.json").write_text("{}")  # a broken quality tier: the CPU tier serves, strict refuses
    assert await served() == cpu_tier
    with pytest.raises(ManifestError, match=r"truthlens.models.detector \(auto, CUDA\)"):
        await served(strict=True)


def test_broken_model_dir_fails_naming_the_config_key_when_strict(tiny_models, tmp_path):
    broken = shutil.copytree(tiny_models["bert-token"], tmp_path / "det")
    (broken / "truthlens.json").write_text("{}")
    with pytest.raises(ManifestError, match=r"truthlens\.models\.detector: .*missing required field"):
        build_engine(engine_settings(detector_dir=str(broken), strict=True))


async def test_broken_explainer_is_left_out_and_the_detector_still_runs(tiny_models, tmp_path, caplog):
    empty = tmp_path / "explainer"
    empty.mkdir()  # e.g. a training run that has not written its files yet
    engine = build_engine(engine_settings(detector_dir=str(tiny_models["bert-token"]), explainer_dir=str(empty)))
    try:
        assert engine.has("detector") and not engine.has("explainer")
        assert "truthlens.models.explainer" in engine.load_errors["explainer"]
        assert "missing" in engine.load_errors["explainer"]
        assert any("truthlens.models.explainer" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
        assert (await engine.detect(["ctx"], None, "some answer")).windows == 1
    finally:
        await engine.close()


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="truthlens.score_method"):
        engine_settings(score_method="mean")
    with pytest.raises(ValueError, match="truthlens.models.provider"):
        engine_settings(provider="gpu")


def test_detector_finish_aggregates_windows_per_answer_token(tiny_models):
    det = Detector(OnnxModel(tiny_models["bert-token"], "detector", RuntimeOptions("cpu")))
    rows = (Row((0,) * 6, (0,) * 6, 2, 0, 3), Row((0,) * 6, (0,) * 6, 2, 1, 3))  # two windows, answer tokens 0-2 and 1-3
    pi = PairInput(rows, ((0, 1), (2, 3), (4, 5), (6, 7)), 4)
    p0 = np.zeros((6, 2), np.float32)
    p0[2:5, 1] = [0.2, 0.9, 0.1]
    p1 = np.zeros((6, 2), np.float32)
    p1[2:5, 1] = [0.5, 0.3, 0.8]
    scores = det.finish(pi, [p0, p1])
    assert scores.probs.tolist() == pytest.approx([0.2, 0.9, 0.3, 0.8])
    assert scores.windows == 2


def test_synchronous_predict_batch_matches_engine_windows(tiny_models):
    det = Detector(OnnxModel(tiny_models["bert-token"], "detector", RuntimeOptions("cpu")))
    out = det.predict_batch([(LONG_CONTEXT, "q", ANSWER), ([], None, "short answer")])
    assert out[0].windows > 1 and out[1].windows == 1
    assert len(out[0].probs) == len(out[0].offsets) and all(0 <= p <= 1 for p in out[0].probs)


async def test_empty_answer_has_nothing_to_judge(engine_factory):
    result = await engine_factory().detect(["ctx"], "q", "   ")
    assert (result.score, result.spans, result.windows) == (0.0, (), 0)


async def _until(predicate, what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never reached: {what}")


def _hold_detector(engine):
    """Block the detector's forward pass on a gate (the real model runs once the gate opens)."""
    import threading

    gate, entered = threading.Event(), threading.Event()
    batcher = engine._batchers["detector"]
    real = batcher._run

    def held(rows):
        entered.set()
        gate.wait(30)
        return real(rows)

    batcher._run = held
    batcher.entered = entered  # type: ignore[attr-defined]
    return gate, batcher


async def test_overloaded_engine_answers_at_once_instead_of_queueing(engine_factory):
    from extproc.inference.api import Overloaded

    engine = engine_factory(max_queue=1, explainer_enabled=False)
    gate, batcher = _hold_detector(engine)
    first = asyncio.ensure_future(engine.detect(["ctx"], None, "first answer"))
    await _until(lambda: batcher.pending == 1, "first request admitted")
    with pytest.raises(Overloaded):
        await engine.detect(["ctx"], None, "second answer")
    gate.set()
    assert (await first).windows == 1


async def test_timed_out_request_is_dropped_before_the_forward_pass(engine_factory):
    engine = engine_factory(explainer_enabled=False)
    gate, batcher = _hold_detector(engine)
    first = asyncio.ensure_future(engine.detect(["ctx"], None, "first answer"))
    await _until(batcher.entered.is_set, "first batch inside the forward pass")
    abandoned = asyncio.ensure_future(engine.detect(["ctx"], None, "abandoned answer"))
    await _until(lambda: batcher.pending == 2, "second request queued")
    abandoned.cancel()  # what asyncio.wait_for does when the gateway's inference timeout fires
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    gate.set()
    await first
    await _until(lambda: batcher.pending == 0, "queue drained")
    assert batcher.dropped == 1 and batcher.batches == 1


@pytest.mark.parametrize("configured, sentinel_threads, detector_threads", [(0, 1, 0), (3, 3, 3)])
async def test_sentinel_runs_single_threaded_unless_threads_are_configured(
        engine_factory, configured, sentinel_threads, detector_threads):
    engine = engine_factory(intra_op_threads=configured)
    threads = {role: m.session.get_session_options().intra_op_num_threads for role, m in engine._models.items()}
    assert threads["sentinel"] == sentinel_threads and threads["detector"] == detector_threads


async def test_a_huge_context_is_too_large_at_once_and_others_are_still_checked(engine_factory):
    """#19 item 2: a 4 MB context used to be tokenized, windowed and run (minutes of CPU, every other request
    timing out behind it). Over batching.max_request_tokens it is refused before any model work, and a request
    arriving with it is served."""
    from extproc.inference.api import TooLarge

    engine = engine_factory(max_request_tokens=512)
    batcher = engine._batchers["detector"]
    huge = ["Paris is the capital of France. " * (4 * 1024 * 1024 // 32)]
    big = asyncio.ensure_future(engine.detect(huge, "What is the capital?", ANSWER))
    normal = asyncio.ensure_future(engine.detect(LONG_CONTEXT[1:], "When?", ANSWER))
    with pytest.raises(TooLarge, match="max_request_tokens 512"):  # refused by the budget, not timed out
        await big
    assert isinstance(await normal, DetectionResult)
    assert batcher.pending == 0 and batcher.queued_tokens == 0  # the huge one never queued a row


async def test_a_context_over_the_budget_is_read_through_its_best_windows(engine_factory):
    """Text under the cheap character bound is counted in model tokens (every context window): when the windows
    overflow the budget, the answer reads only the windows sharing most tokens with it (those that hold its
    evidence) instead of passing unchecked; an answer that cannot fit even one window per chunk is refused."""
    from extproc.inference.api import TooLarge

    engine = engine_factory(max_request_tokens=512, explainer_enabled=False)
    filler = "Lyon has a large old town and two rivers. " * 60  # ~700 tokens that say nothing of the answer
    context = [filler + "The capital of France is Paris. The tower was built in 1889."]
    full = engine.detector.prepare(context, "What is the capital?", ANSWER)
    assert len(full.rows) > 1 and sum(map(len, full.rows)) > 512
    result = await engine.detect(context, "What is the capital?", ANSWER)
    row = max(map(len, full.rows))
    assert 1 <= result.windows == 512 // row < len(full.rows)  # as many windows as 512 tokens hold
    kept = engine._detector_within(_budget(row), full, 0).rows  # room for one: the window with the evidence
    assert len(kept) == 1 and "paris" in engine.detector.model.tokenizer.decode(list(kept[0].input_ids)).lower()
    assert "paris" not in engine.detector.model.tokenizer.decode(list(full.rows[0].input_ids)).lower()
    long_answer = "The capital of France is Lyon and the tower was built in 1925. " * 25  # many answer chunks
    with pytest.raises(TooLarge, match="detector: .* over max_request_tokens 512"):
        await engine.detect(LONG_CONTEXT[1:], "What is the capital?", long_answer)
    assert isinstance(await engine.detect(LONG_CONTEXT[1:], None, ANSWER), DetectionResult)


def _budget(limit: int):  # noqa: ANN202
    from extproc.inference.engine import _Budget

    return _Budget(limit)


async def test_a_long_answer_over_the_verifier_budget_is_verified_against_fewer_windows(engine_factory):
    """Each answer sentence is verified against its explainer.max_windows best context windows; when those rows
    overflow the request budget (long answers over long web contexts: 16 of 600 ExpertQA answers in the suite),
    the answer is verified against fewer windows per sentence instead of passing unchecked."""
    from extproc.inference.api import TooLarge

    context = ["Paris is the capital of France. The Eiffel tower is in Paris. " * 60]
    probe = engine_factory()
    det = sum(map(len, probe.detector.prepare(context, "Where?", ANSWER).rows))
    sentences = [ANSWER[s:e] for s, e in answer_sentences(ANSWER)]
    full = probe.explainer.prepare(context, sentences, probe.settings.explainer_max_windows)
    per_sentence = [len(p.rows) for p in full]
    assert min(per_sentence) > 2  # the context gives every sentence several windows
    ver = sum(len(r) for p in full for r in p.rows)
    row = max(len(r) for p in full for r in p.rows)

    engine = engine_factory(max_request_tokens=det + 2 * row * len(sentences))  # room for two windows each
    asked: list[int] = []
    prepare = engine.explainer.prepare
    engine.explainer.prepare = lambda c, h, k=0: (asked.append(k), prepare(c, h, k))[1]
    assert det + ver > engine.settings.max_request_tokens
    result = await engine.detect(context, "Where?", ANSWER)
    assert isinstance(result, DetectionResult) and "verifier" in result.signals
    assert asked == [engine.settings.explainer_max_windows, 2]

    tight = engine_factory(max_request_tokens=row * len(sentences) - 1)  # not even one window per sentence
    with pytest.raises(TooLarge, match="max_request_tokens"):
        await tight.detect(context, "Where?", ANSWER)


async def test_a_huge_prompt_is_clipped_before_the_sentinel_tokenizes_it(engine_factory):
    """#19: the sentinel reads max_length tokens (head and tail) but tokenized the whole prompt first: a 4 MB
    question held a prep thread for 2.6 s. Clipped to what those tokens can come from, the verdict is the same."""
    from extproc.inference.engine import clip_prompt

    engine = engine_factory(explainer_enabled=False)
    head, tail = "What is the capital of France? " * 20, " Is it Paris or Lyon?"
    middle = "the tower was built in 1889 and is 330 metres tall . " * 4000  # ~200 KB
    full, clipped = head + middle + tail, clip_prompt(head + middle + tail, 64 * 8)
    assert len(clipped) <= 2 * 64 * 8 + 1
    a, b = engine.sentinel.prepare([full])[0], engine.sentinel.prepare([clipped])[0]
    assert a.input_ids == b.input_ids  # the same row: the same verdict
    huge = head + middle * 20 + tail  # ~4 MB
    seen: list[int] = []
    prepare = engine.sentinel.prepare
    engine.sentinel.prepare = lambda prompts: (seen.extend(len(p) for p in prompts), prepare(prompts))[1]
    result = await engine.classify_prompt(huge)
    from extproc.inference.api import MAX_CHARS_PER_TOKEN

    bound = 2 * engine.sentinel.model.manifest.max_length * MAX_CHARS_PER_TOKEN + 1  # head + tail
    assert seen and max(seen) <= bound < len(huge) // 1000  # only the clipped text was tokenized
    assert result.confidence == (await engine.classify_prompt(clipped)).confidence


async def test_the_verifier_rows_count_before_any_model_runs(engine_factory):
    """The fused path tokenizes the verifier's rows beside the detector's and counts both first: a request whose
    verifier stage would pass the budget costs no forward pass at all (it used to run the detector, then refuse)."""
    import dataclasses

    from extproc.inference.api import TooLarge
    from extproc.inference.spans import answer_sentences

    engine = engine_factory(response_threshold=0.2)
    context = ["Paris is the capital of France. " * 12]
    det = sum(len(r) for r in engine.detector.prepare(context, "q", ANSWER).rows)
    texts = [ANSWER[s:e] for s, e in answer_sentences(ANSWER)]
    ver = sum(len(r) for p in engine.explainer.prepare(context, texts, engine.settings.explainer_max_windows)
              for r in p.rows)
    engine.settings = dataclasses.replace(engine.settings, max_request_tokens=det + ver - 1)
    with pytest.raises(TooLarge, match="verifier"):
        await engine.detect(context, "q", ANSWER)
    assert engine._batchers["detector"].batches == 0 and engine._batchers["explainer"].batches == 0
    engine.settings = dataclasses.replace(engine.settings, max_request_tokens=det + ver)
    assert isinstance(await engine.detect(context, "q", ANSWER), DetectionResult)
