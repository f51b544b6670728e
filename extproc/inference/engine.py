"""The ONNX engine behind `extproc.inference.api.Engine`.

Per request: tokenization/windowing on a small thread pool (short sentinel
prompts and the sentinel's lexical prefilter run inline), forward passes on
each model's batcher thread, span merging and scoring (cheap numpy) on the
loop. Models that are not configured or fail to load are logged and reported
by `has()`; the gateway then marks responses unchecked rather than clean.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Sequence

from extproc.inference.api import (
    MAX_CHARS_PER_TOKEN,
    Claim,
    DetectionResult,
    ModelInfo,
    ModelUnavailable,
    SentinelResult,
    Span,
    TooLarge,
)
from extproc.inference.batcher import Batcher
from extproc.inference.calibration import CALIBRATION_FILE, Calibration, CalibrationError, CalibrationSet, check_models
from extproc.inference.latent_audit import AuditError, LatentAudit, audit_features
from extproc.inference.manifest import MODEL_FILE, ManifestError
from extproc.inference.models import Detector, Explainer, NliResult, OnnxModel, Sentinel, TokenScores
from extproc.inference.prefilter import PREFILTER_FILE, LexicalPrefilter
from extproc.inference.runtime import CUDA, PROVIDERS, RuntimeOptions, cuda_available
from extproc.inference.spans import (
    SCORE_METHODS,
    RawSpan,
    SpanFilter,
    answer_sentences,
    filter_spans,
    merge_tokens,
    response_score,
    sentence_bounds,
    sentence_doubt,
    sentence_for,
    snap_to_words,
)
from extproc.inference.surrogate import SurrogateLM, SurrogateReading
from extproc.inference.windowing import PairInput, best_windows

log = logging.getLogger(__name__)

# Prompts up to this many characters are tokenized on the event loop (tens of microseconds,
# less than the hop to the prep pool); longer ones go to the pool like detector inputs.
INLINE_PREP_CHARS = 2048
# Sentinel rows are at most its max_length (64 for the bundled one): intra-op parallelism
# costs more thread hand-offs than it saves there, so "0 = default" means one thread for it.
SENTINEL_DEFAULT_THREADS = 1

SEVERITY = {"contradiction": 4, "neutral": 2, "entailment": 1}
CONTEXT_PMI = "context_pmi"  # the surrogate LM's signal: -mean context PMI over the answer tokens (nats)
LATENT_AUDIT = "latent_audit"  # Mahalanobis distance of the answer's hidden states to faithful answers'
LENS_EMERGENCE = "lens_emergence"  # logit lens: how early the surrogate's layers predict the answer tokens
CONTEXT_MMD = "context_mmd"  # MMD of next-token distributions under the real vs another request's passages
RESERVOIR_CHARS = 8000  # per kept context: enough for the surrogate's window, bounded memory


class _Budget:
    """One detect call's model tokens (`max_request_tokens`), spent stage by stage before each submit."""

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int) -> None:
        self.limit, self.spent = limit, 0

    def check_chars(self, chars: int) -> None:
        if chars > self.limit * MAX_CHARS_PER_TOKEN:
            raise TooLarge(f"{chars} characters to judge: over {MAX_CHARS_PER_TOKEN} per token of "
                           f"max_request_tokens {self.limit}")

    def spend(self, rows: Sequence[Sequence[int]], stage: str) -> None:
        tokens = sum(len(r) for r in rows)
        if self.spent + tokens > self.limit:
            raise TooLarge(f"{stage}: {self.spent + tokens} model tokens for this request, over "
                           f"max_request_tokens {self.limit}")
        self.spent += tokens


@dataclass(frozen=True)
class EngineSettings:
    """Plain settings, built from the `truthlens.*` config (`from_config`) by the wiring layer.

    The config schema holds every default: the fields it maps have none here, so the server, the
    benches and the tests cannot run on thresholds the config never gives. Only what the config
    does not set (strict loading, the tokenization pool, benches' float twins) has a default.
    """

    sentinel_dir: str | None
    detector_dir: str | None
    gpu_detector_dir: str | None  # replaces detector_dir where its session runs on CUDA (models.detector: auto)
    explainer_dir: str | None
    surrogate_dir: str | None  # causal LM for the white-box signals
    context_pmi: bool  # use the surrogate's context PMI in the fused score when it is loaded
    surrogate_max_tokens: int  # per surrogate pass: prompt + passages + answer
    latent_audit_file: str | None  # `truthlens calibrate` output: adds the LatentAudit signal
    lens_emergence: bool  # LUMINA: logit-lens emergence (two more head projections per answer token)
    context_mmd: bool  # LUMINA: MMD vs another request's passages (a third surrogate pass)
    reservoir_size: int  # contexts of recent requests kept (in memory only) for context_mmd
    provider: str
    intra_op_threads: int
    inter_op_threads: int
    sentinel_threshold: float
    token_threshold: float
    nli_entailment_threshold: float
    min_span_tokens: int
    min_span_chars: int
    min_span_confidence: float
    score_method: str
    response_threshold: float  # fused: a sentence whose (calibrated) doubt reaches it carries spans
    explainer_enabled: bool
    drop_entailed: bool
    explainer_max_windows: int  # per sentence/hypothesis: the best-matching context windows (0 = all)
    max_batch_tokens: int
    max_wait_ms: float
    max_queue: int
    max_request_tokens: int  # one detect call's model tokens (detector + verifier rows); over it: TooLarge at once
    max_queued_tokens: int  # per model batcher, tokens waiting to run; beyond it: Overloaded
    sentinel_prefilter: bool  # use the sentinel directory's prefilter.npz when it has one
    prep_threads: int = 2  # tokenization / windowing pool
    strict: bool = False  # True: a present-but-invalid model directory raises instead of being left out
    float_twins: bool = False  # benches: int8 encoders as their float twins on the CPU (what CUDA runs)

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"truthlens.models.provider: {self.provider!r} is not one of {list(PROVIDERS)}")
        if self.score_method not in SCORE_METHODS:
            raise ValueError(f"truthlens.score_method: {self.score_method!r} is not one of {list(SCORE_METHODS)}")

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> "EngineSettings":
        """From the typed config (`extproc.config.schema.Config`; only reads attributes), with `overrides`
        (benches and tools: other model directories, provider, ...)."""
        tl = cfg.truthlens
        m, t, b, e = tl.models, tl.thresholds, tl.batching, tl.explainer
        settings = dict(
            sentinel_dir=m.sentinel, detector_dir=m.detector_dirs[0], gpu_detector_dir=m.detector_dirs[1],
            explainer_dir=m.explainer, surrogate_dir=m.surrogate,
            context_pmi=tl.signals.context_pmi, surrogate_max_tokens=tl.signals.surrogate_max_tokens,
            latent_audit_file=tl.signals.latent_audit, lens_emergence=tl.signals.lens_emergence,
            context_mmd=tl.signals.context_mmd, reservoir_size=tl.signals.reservoir_size,
            provider=m.provider, intra_op_threads=m.intra_op_threads, inter_op_threads=m.inter_op_threads,
            sentinel_threshold=t.sentinel, token_threshold=t.token, nli_entailment_threshold=t.nli_entailment,
            min_span_tokens=t.min_span_tokens, min_span_chars=t.min_span_chars,
            min_span_confidence=t.min_span_confidence, score_method=tl.score_method, response_threshold=t.response,
            explainer_enabled=e.enabled, drop_entailed=e.drop_entailed, explainer_max_windows=e.max_windows,
            max_batch_tokens=b.max_batch_tokens, max_wait_ms=b.max_wait_ms, max_queue=b.max_queue,
            max_request_tokens=b.max_request_tokens, max_queued_tokens=b.max_queued_tokens,
            sentinel_prefilter=m.sentinel_prefilter,
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"EngineSettings has no field(s) {sorted(unknown)}")
        return cls(**(settings | overrides))

    @property
    def span_filter(self) -> SpanFilter:
        return SpanFilter(self.token_threshold, self.min_span_tokens, self.min_span_chars, self.min_span_confidence)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _span(answer: str, start: int, end: int, score: float, tokens: int, v: NliResult | None) -> Span:
    return Span(
        start=start, end=end, text=answer[start:end], score=score, tokens=tokens,
        nli_label=v.label if v else None, nli_confidence=v.confidence if v else None,
        severity=SEVERITY[v.label] if v else None,
    )


def _tokens_in(offsets: Sequence[tuple[int, int]], start: int, end: int) -> int:
    return sum(1 for a, b in offsets if b > a and a < end and b > start)


class OnnxEngine:
    """Implements api.Engine over whichever of sentinel / detector / explainer loaded."""

    def __init__(self, settings: EngineSettings, models: dict[str, OnnxModel]) -> None:
        self.settings = settings
        self._models = models
        self.sentinel = Sentinel(models["sentinel"]) if "sentinel" in models else None
        self.prefilter: LexicalPrefilter | None = None  # set by build_engine when the sentinel ships one
        self.detector = Detector(models["detector"]) if "detector" in models else None
        self.explainer = Explainer(models["explainer"]) if "explainer" in models else None
        self._batchers = {
            role: Batcher(model.infer, role, settings.max_batch_tokens, settings.max_wait_ms, settings.max_queue,
                          max_queued_tokens=settings.max_queued_tokens)
            for role, model in models.items()
        }
        self._prep = ThreadPoolExecutor(max_workers=max(1, settings.prep_threads), thread_name_prefix="truthlens-prep")
        self._filter = settings.span_filter
        self.calibration: CalibrationSet | None = None  # set by build_engine from the detector directory
        self.surrogate: SurrogateLM | None = None  # set by build_engine when the surrogate directory loads
        self.latent_audit: LatentAudit | None = None  # set by build_engine from signals.latent_audit
        # other requests' passages for context_mmd: never returned or logged, only read by the surrogate
        self._reservoir: deque[tuple[str, ...]] = deque(maxlen=max(1, settings.reservoir_size))
        # one surrogate pass at a time: it is the heaviest model, and queueing keeps the encoders' cores free
        self._surrogate_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="truthlens-surrogate")
        self.load_errors: dict[str, str] = {}  # role -> why its directory did not load

    def models(self) -> Sequence[ModelInfo]:
        out = [ModelInfo(role, m.name, str(m.path), m.provider) for role, m in self._models.items()]
        if self.surrogate is not None:
            out.append(ModelInfo("surrogate", self.surrogate.name, str(self.surrogate.path), self.surrogate.provider))
        return tuple(out)

    def has(self, role: str) -> bool:
        return role in self._models or (role == "surrogate" and self.surrogate is not None)

    @property
    def signals(self) -> frozenset[str]:
        """The white-box signals this engine adds to the fused score: computed only when a calibration fit uses them."""
        if self.surrogate is None or self.calibration is None:
            return frozenset()
        flags = {CONTEXT_PMI: self.settings.context_pmi, LATENT_AUDIT: self.latent_audit is not None,
                 LENS_EMERGENCE: self.settings.lens_emergence, CONTEXT_MMD: self.settings.context_mmd}
        have = {name for name, on in flags.items() if on}
        fit = self.calibration.for_signals(frozenset(have), "fused")
        return frozenset(fit.signals) if fit is not None else frozenset()

    async def _prepare(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._prep, fn, *args)

    def prefilter_prompt(self, prompt: str) -> SentinelResult | None:
        """The lexical prefilter's verdict when it is confident, else None (ask the model).

        Synchronous on purpose: a few microseconds on at most 1 KB of text, so the
        gateway can settle the obvious prompts without a task, a timer or a thread hop.
        """
        if self.prefilter is None:
            return None
        t0 = time.perf_counter()
        decided, p = self.prefilter.decide(prompt)
        return None if decided is None else SentinelResult(decided, p, _ms(t0), by="prefilter")

    async def classify_prompt(self, prompt: str, *, prefiltered: bool = False) -> SentinelResult:
        if self.sentinel is None:
            raise ModelUnavailable("sentinel model not loaded")
        t0 = time.perf_counter()
        quick = None if prefiltered else self.prefilter_prompt(prompt)
        if quick is not None:
            return quick
        prompt = clip_prompt(prompt, self.sentinel.model.manifest.max_length * MAX_CHARS_PER_TOKEN)
        if len(prompt) <= INLINE_PREP_CHARS:  # tokenizing a short prompt costs less than a thread hop
            rows = self.sentinel.prepare([prompt])
        else:
            rows = await self._prepare(self.sentinel.prepare, [prompt])
        p = self.sentinel.finish(await self._batchers["sentinel"].submit(rows))[0]
        return SentinelResult(p >= self.settings.sentinel_threshold, p, _ms(t0))

    async def detect(self, context: Sequence[str], question: str | None, answer: str,
                     signals: frozenset[str] | None = None) -> DetectionResult:
        if self.detector is None:
            raise ModelUnavailable("detector model not loaded")
        t0 = time.perf_counter()
        if not answer.strip():  # nothing to judge: no tokens, no windows
            return DetectionResult(score=0.0, spans=(), windows=0, latency_ms=_ms(t0))
        context = [c for c in context if c]
        budget = _Budget(self.settings.max_request_tokens)  # before any work: a huge request costs nothing
        budget.check_chars(sum(map(len, context)) + len(question or "") + len(answer))
        fused = (self.settings.score_method == "fused" and bool(context) and self.explainer is not None
                 and self.settings.explainer_enabled)
        # the surrogate (the slowest signal) runs beside the detector and the verifier, not after them
        wanted = self.signals if signals is None else self.signals & signals
        pmi_task = asyncio.ensure_future(self._surrogate_signals(context, question, answer, wanted)) \
            if fused and wanted else None
        try:
            # fused: the verifier's rows are tokenized beside the detector's, and both are counted against the
            # budget before either model runs (an over-budget request costs no forward pass)
            sentences = answer_sentences(answer) if fused else []
            texts = [answer[s:e] for s, e in sentences]
            verifier_prep: list[Any] | None = None
            if texts:
                prepared, verifier_prep = await asyncio.gather(
                    self._prepare(self.detector.prepare, context, question, answer),
                    self._prepare(self.explainer.prepare, context, texts, self.settings.explainer_max_windows))
            else:
                prepared = await self._prepare(self.detector.prepare, context, question, answer)
            # the verifier's floor: one context window per sentence
            reserve = sum(max(map(len, p.rows), default=0) for p in verifier_prep) if verifier_prep else 0
            prepared = self._detector_within(budget, prepared, reserve)
            budget.spend(prepared.rows, "detector")
            if verifier_prep is not None:
                verifier_prep = await self._verifier_within(budget, verifier_prep, context, texts)
                budget.spend([r for p in verifier_prep for r in p.rows], "verifier")
            t_prep = _ms(t0)
            scores: TokenScores = self.detector.finish(prepared, await self._batchers["detector"].submit(prepared.rows))
            raw = filter_spans(answer, merge_tokens(answer, scores.offsets, scores.probs.tolist(), self._filter.token_threshold), self._filter)
            timings = {"tokenize": t_prep, "detector": _ms(t0) - t_prep}
            if fused:
                return await self._detect_fused(context, answer, scores, raw, t0, timings, pmi_task, sentences,
                                                verifier_prep)
        except BaseException:
            if pmi_task is not None:
                pmi_task.cancel()
            raise
        verdicts: list[NliResult | None] = [None] * len(raw)
        if raw and context and self.explainer is not None and self.settings.explainer_enabled:
            t1 = time.perf_counter()
            verdicts = await self._explain(context, answer, raw, budget)
            timings["explainer"] = _ms(t1)
        kept_raw: list[RawSpan] = []
        spans: list[Span] = []
        dropped = 0
        for sp, v in zip(raw, verdicts):
            if v is not None and self.settings.drop_entailed and v.entailment >= self.settings.nli_entailment_threshold:
                dropped += 1
                continue
            kept_raw.append(sp)
            spans.append(_span(answer, sp.start, sp.end, sp.score, len(sp.probs), v))
        # without the verifier (no context, explainer off) "fused" falls back to the best span
        method = "max_span" if self.settings.score_method == "fused" else self.settings.score_method
        return DetectionResult(
            score=self._calibrated(response_score(kept_raw, method), method), spans=tuple(spans),
            windows=scores.windows, dropped_spans=dropped, latency_ms=_ms(t0), timings_ms=timings,
        )

    @staticmethod
    def _detector_within(budget: _Budget, prepared: PairInput, reserve: int) -> PairInput:
        """A long answer over a long context (answer chunks x context windows) can overflow the request budget
        through the detector alone; such an answer would pass unchecked. Each answer chunk then reads only its
        best-matching context windows (`best_windows`), as many as the budget less `reserve` allows, at least
        one (below that, `spend` refuses the request as before)."""
        rows = prepared.rows
        room = budget.limit - budget.spent - reserve
        if not rows or sum(map(len, rows)) <= room:
            return prepared
        chunks = len({(r.second_first, r.second_count) for r in rows})
        per_chunk = room // (chunks * max(map(len, rows)))
        return best_windows(prepared, per_chunk) if per_chunk >= 1 else prepared

    async def _verifier_within(self, budget: _Budget, prepared: list[PairInput], context: Sequence[str],
                               sentences: Sequence[str]) -> list[PairInput]:
        """A long answer over a long context (each sentence against its `explainer.max_windows` best-matching
        windows) can overflow the request budget through the verifier alone; such an answer would pass
        unchecked. It is verified against fewer windows per sentence instead: as many as the budget left after
        the detector allows, at least one (below that, `spend` refuses the request as before)."""
        rows = [r for p in prepared for r in p.rows]
        room = budget.limit - budget.spent
        if sum(map(len, rows)) <= room or not rows:
            return prepared
        windows = room // (max(map(len, rows)) * len(sentences))  # each row holds at most that many tokens
        if windows < 1:
            return prepared
        return await self._prepare(self.explainer.prepare, context, sentences, windows)  # type: ignore[union-attr]

    async def _detect_fused(
        self, context: Sequence[str], answer: str, scores: TokenScores, raw: Sequence[RawSpan], t0: float,
        timings: dict[str, float], pmi_task: "asyncio.Future[dict[str, float]] | None",
        sentences: Sequence[tuple[int, int]], verifier_prep: Any,
    ) -> DetectionResult:
        """Every answer sentence is verified against the context; a sentence is a span when its
        calibrated doubt (detector x verifier, `sentence_doubt`) reaches thresholds.response (whole
        sentences beat the detector's own token spans on span F1 on every set of the real-output suite).
        A flagged sentence whose top NLI label is entailment is reported as neutral (not supported,
        confidence 1 - P(entailment)), so a span is never both flagged and labelled entailed."""
        t1 = time.perf_counter()
        verdicts = await self._verify(context, [answer[s:e] for s, e in sentences], prepared=verifier_prep)
        timings["verifier"] = _ms(t1)
        signals: dict[str, float] = {}
        if pmi_task is not None:
            t2 = time.perf_counter()
            signals = await pmi_task
            timings["surrogate_wait"] = _ms(t2)  # what the surrogate added beyond the encoders it ran beside
        doubt = sentence_doubt(scores.offsets, scores.probs.tolist(), sentences, [v.entailment for v in verdicts])
        cal = self._calibration("fused", frozenset(signals))
        used = {k: v for k, v in signals.items() if cal is not None and k in cal.signals}
        probs = [cal(d, used) if cal is not None else d for d in doubt]
        spans: list[Span] = []
        dropped = 0
        for (s, e), v, p, d in zip(sentences, verdicts, probs, doubt):
            if d <= 0.0 or p < self.settings.response_threshold:
                dropped += sum(1 for sp in raw if sp.start < e and sp.end > s)  # detector spans in an unflagged sentence
                continue
            if v.label == "entailment":  # flagged all the same: report it as not supported, never as entailed
                v = NliResult("neutral", 1.0 - v.entailment, v.entailment)
            a, b = snap_to_words(answer, s, e)
            spans.append(_span(answer, a, b, p, _tokens_in(scores.offsets, a, b), v))
        return DetectionResult(
            score=max(probs, default=0.0), spans=tuple(spans), windows=scores.windows, dropped_spans=dropped,
            latency_ms=_ms(t0), timings_ms=timings, signals=("detector", "verifier", *sorted(used)),
        )

    def _calibration(self, method: str, available: frozenset[str] = frozenset()) -> Calibration | None:
        return self.calibration.for_signals(available, method) if self.calibration is not None else None

    def _calibrated(self, raw: float, method: str) -> float:
        cal = self._calibration(method)
        return cal(raw) if cal is not None else raw

    async def _surrogate_signals(self, context: Sequence[str], question: str | None, answer: str,
                                 wanted: frozenset[str]) -> dict[str, float]:
        """The surrogate's signals for this answer; {} when it fails (and no context_mmd before the reservoir has
        another request's passages): the score then uses the fit made without the missing ones."""
        assert self.surrogate is not None
        other = None
        if CONTEXT_MMD in wanted:  # only requests that use the signal lend their passages to later ones
            other = random.choice(self._reservoir) if self._reservoir else None
            self._reservoir.append(_bounded_context(context))
        try:
            reading: SurrogateReading = await asyncio.get_running_loop().run_in_executor(
                self._surrogate_pool, lambda: self.surrogate.read(  # type: ignore[union-attr]
                    context, question, answer, hidden=LATENT_AUDIT in wanted, lens=LENS_EMERGENCE in wanted,
                    other_context=other))
        except Exception as exc:  # noqa: BLE001 - a failed signal must not fail the check
            log.warning("surrogate: reading the answer failed (%s); scoring without its signals", exc)
            return {}
        out = {CONTEXT_PMI: -reading.pmi.mean} if CONTEXT_PMI in wanted else {}
        if self.latent_audit is not None and LATENT_AUDIT in wanted and reading.hidden is not None:
            out[LATENT_AUDIT] = self.latent_audit.distance(audit_features(reading.hidden))
        if LENS_EMERGENCE in wanted and reading.emergence is not None:
            out[LENS_EMERGENCE] = reading.emergence
        if CONTEXT_MMD in wanted and reading.mmd is not None:
            out[CONTEXT_MMD] = reading.mmd
        return out

    async def _verify(self, context: Sequence[str], sentences: Sequence[str],
                      budget: _Budget | None = None, prepared: Any = None) -> list[NliResult]:
        """NLI of each sentence against its best-matching context windows, in one batched run (`prepared`: the
        sentences' rows, tokenized and counted against the budget already)."""
        assert self.explainer is not None
        if not sentences:
            return []
        if prepared is None:
            prepared = await self._prepare(self.explainer.prepare, context, sentences,
                                           self.settings.explainer_max_windows)
            if budget is not None:
                budget.spend([r for p in prepared for r in p.rows], "verifier")
        rows = [r for p in prepared for r in p.rows]
        probs = await self._batchers["explainer"].submit(rows)
        return self.explainer.finish(prepared, probs)

    async def _explain(self, context: Sequence[str], answer: str, raw: Sequence[RawSpan],
                       budget: _Budget | None = None) -> list[NliResult | None]:
        """All spans of one response in one batched NLI run; spans in the same sentence share a pair."""
        assert self.explainer is not None
        bounds = sentence_bounds(answer)
        sentences = [sentence_for(answer, bounds, sp.start, sp.end) for sp in raw]
        unique = list(dict.fromkeys(sentences))
        by_sentence = dict(zip(unique, await self._verify(context, unique, budget)))
        return [by_sentence[s] for s in sentences]

    async def explain(self, context: Sequence[str], answer: str,
                      ranges: Sequence[tuple[int, int]] | None = None) -> tuple[Claim, ...]:
        """The explainer's NLI verdict per range of the answer (each judged as the sentence(s) holding it),
        or per answer sentence when no range is given. ValueError: no context, or a range outside the answer."""
        if self.explainer is None:
            raise ModelUnavailable("explainer model not loaded")
        context = [c for c in context if c]
        if not context:
            raise ValueError("explain needs at least one non-empty context passage")
        if ranges:
            bad = [(a, b) for a, b in ranges if not 0 <= a < b <= len(answer)]
            if bad:
                raise ValueError(f"ranges {bad} are not inside the answer (0..{len(answer)})")
            bounds = sentence_bounds(answer)
            pieces = [(a, b, sentence_for(answer, bounds, a, b)) for a, b in ranges]
        else:
            pieces = [(a, b, answer[a:b]) for a, b in answer_sentences(answer)]
        unique = list(dict.fromkeys(text for _, _, text in pieces))
        budget = _Budget(self.settings.max_request_tokens)
        budget.check_chars(sum(map(len, context)) + sum(map(len, unique)))
        by_text = dict(zip(unique, await self._verify(context, unique, budget)))
        return tuple(Claim(a, b, text, by_text[text].label, by_text[text].confidence, by_text[text].entailment)
                     for a, b, text in pieces)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for batcher in self._batchers.values():
            await loop.run_in_executor(None, batcher.close)
        self._prep.shutdown(wait=False, cancel_futures=True)
        self._surrogate_pool.shutdown(wait=False, cancel_futures=True)


def build_engine(settings: EngineSettings) -> OnnxEngine:
    """Load every configured model directory.

    A directory that is not configured or does not exist is logged and its role
    left out (`has(role)` is False). One that exists but is invalid is logged as
    an error naming `truthlens.models.<role>` and what is wrong, and its role is
    left out too (one broken explainer must not take the detector down); the
    reason is kept in `engine.load_errors`. With `settings.strict` it raises
    ManifestError instead. Provider `cuda` without a CUDA session always raises
    ProviderUnavailable: the operator asked for a GPU explicitly.
    """
    options = RuntimeOptions(settings.provider, settings.intra_op_threads, settings.inter_op_threads,
                             settings.float_twins)
    dirs = {"sentinel": settings.sentinel_dir, "detector": settings.detector_dir,
            "explainer": settings.explainer_dir if settings.explainer_enabled else None}
    models: dict[str, OnnxModel] = {}
    errors: dict[str, str] = {}
    for role, directory in dirs.items():
        if directory is None:
            log.info("%s: no model directory configured", role)
            continue
        directory = str(Path(directory).expanduser())  # relative paths: the working directory
        if not Path(directory).exists():
            log.warning("%s: model directory %s does not exist; %s disabled", role, directory, role)
            continue
        if role == "detector" and settings.gpu_detector_dir is not None:
            quality = _quality_detector(settings, options)
            if quality is not None:
                models[role] = quality
                log.info("detector: loaded %s from %s on %s (the quality tier: models.detector auto)", quality.name,
                         quality.path, quality.provider)
                continue
        role_options = options
        if role == "sentinel" and settings.intra_op_threads == 0:
            role_options = replace(options, intra_op_threads=SENTINEL_DEFAULT_THREADS)
        try:
            models[role] = OnnxModel(directory, role, role_options, settings.max_batch_tokens)
        except ManifestError as exc:
            _load_failed(role, f"truthlens.models.{role}: {exc}", f"{role} disabled", settings.strict, errors, exc)
            continue
        log.info("%s: loaded %s from %s on %s", role, models[role].name, directory, models[role].provider)
    engine = OnnxEngine(settings, models)
    if settings.surrogate_dir is not None and (settings.context_pmi or settings.latent_audit_file
                                               or settings.lens_emergence or settings.context_mmd):
        engine.surrogate = _load_surrogate(settings, options, errors)
    if engine.surrogate is not None and settings.latent_audit_file:
        engine.latent_audit = _load_latent_audit(settings, engine.surrogate, errors)
    if "detector" in models:
        engine.calibration = _load_calibration(models, engine.surrogate, settings, errors)
    if "sentinel" in models and settings.sentinel_prefilter:
        engine.prefilter = _load_prefilter(models["sentinel"].path, settings.strict, errors)
    if engine.surrogate is not None and not engine.signals:
        log.warning("surrogate: loaded, but the detector directory's calibration.json has no fused fit with its "
                    "signals: none is computed")
    engine.load_errors = errors
    return engine


def _quality_detector(settings: EngineSettings, options: RuntimeOptions) -> OnnxModel | None:
    """`models.detector: auto`: the quality tier's detector when its session runs on CUDA; None (the CPU tier
    serves) on a CPU, without the directory, or when CUDA does not take it. Under provider `cuda` a session
    that does not get CUDA raises ProviderUnavailable, as for any model."""
    assert settings.gpu_detector_dir is not None
    if settings.provider == "cpu" or not cuda_available():
        return None
    directory = Path(settings.gpu_detector_dir).expanduser()
    if not directory.is_dir():
        log.info("detector: no quality tier at %s; the CPU tier serves on CUDA", directory)
        return None
    try:
        model = OnnxModel(str(directory), "detector", options, settings.max_batch_tokens)
    except ManifestError as exc:
        if settings.strict:
            raise ManifestError(f"truthlens.models.detector (auto, CUDA): {exc}") from exc
        log.error("truthlens.models.detector (auto, CUDA): %s; the CPU tier serves", exc)
        return None
    if model.provider != CUDA:
        log.info("detector: the quality tier runs on %s, not CUDA; the CPU tier serves", model.provider)
        return None
    return model


def _load_failed(key: str, message: str, consequence: str, strict: bool, errors: dict[str, str],
                 cause: Exception) -> None:
    """One optional part did not load: with strict loading a startup error, otherwise logged, kept in
    `engine.load_errors[key]`, and the gateway runs without it."""
    if strict:
        raise ManifestError(message) from cause
    log.error("%s; %s", message, consequence)
    errors[key] = message


def _load_prefilter(directory: Path, strict: bool, errors: dict[str, str]) -> LexicalPrefilter | None:
    """The sentinel's optional lexical prefilter; a broken file costs only the fast path."""
    if not (directory / PREFILTER_FILE).is_file():
        return None
    try:
        pre = LexicalPrefilter.load(directory)
    except ManifestError as exc:
        return _load_failed("sentinel_prefilter", f"truthlens.models.sentinel: {exc}",
                            "sentinel runs without its prefilter", strict, errors, exc)
    log.info("sentinel: lexical prefilter loaded (decides below %s / above %s)",
             pre.band.non_factual_below, pre.band.factual_above)
    return pre


def clip_prompt(prompt: str, keep: int) -> str:
    """The sentinel reads only max_length tokens, its head and tail (`single_row`): tokenizing the rest of a long
    prompt is wasted (2.6 s of a prep thread for a 4 MB question). Keep `keep` characters at each end, which hold
    more than those tokens (MAX_CHARS_PER_TOKEN each), joined by a space."""
    if len(prompt) <= 2 * keep:
        return prompt
    return f"{prompt[:keep]} {prompt[-keep:]}"


def _bounded_context(context: Sequence[str]) -> tuple[str, ...]:
    """A reservoir entry: the passages' head, at most RESERVOIR_CHARS characters in all."""
    kept, room = [], RESERVOIR_CHARS
    for c in context:
        if room <= 0:
            break
        kept.append(c[:room])
        room -= len(kept[-1])
    return tuple(kept)


def _load_surrogate(settings: EngineSettings, options: RuntimeOptions, errors: dict[str, str]) -> SurrogateLM | None:
    """The surrogate LM; missing or broken, the fused score uses the fits without its signals."""
    assert settings.surrogate_dir is not None
    directory = Path(settings.surrogate_dir).expanduser()
    if not directory.exists():
        log.warning("surrogate: model directory %s does not exist (make setup-serve builds it); "
                    "scores use no white-box signals", directory)
        return None
    try:
        lm = SurrogateLM(directory, options, settings.surrogate_max_tokens)
    except (OSError, ValueError) as exc:
        return _load_failed("surrogate", f"truthlens.models.surrogate: {exc}", "scores use no white-box signals",
                            settings.strict, errors, exc)
    log.info("surrogate: loaded %s from %s on %s", lm.name, directory, lm.provider)
    return lm


def _load_latent_audit(settings: EngineSettings, surrogate: SurrogateLM, errors: dict[str, str]) -> LatentAudit | None:
    """signals.latent_audit: refused when it was made for another surrogate or other hidden layers."""
    assert settings.latent_audit_file is not None
    try:
        audit = LatentAudit.load(Path(settings.latent_audit_file).expanduser(),
                                 model_sha256=str(surrogate.manifest.provenance.get("gguf_sha256")))
        if audit.layers != surrogate.manifest.hidden_layers:
            raise AuditError(f"{settings.latent_audit_file}: fitted on hidden layers {list(audit.layers)}, the surrogate "
                             f"exports {list(surrogate.manifest.hidden_layers)}")
    except AuditError as exc:
        return _load_failed("latent_audit", f"truthlens.signals.latent_audit: {exc}", "the signal is off",
                            settings.strict, errors, exc)
    log.info("latent_audit: loaded %s (threshold %.3f)", settings.latent_audit_file, audit.threshold)
    return audit


def _load_calibration(models: dict[str, OnnxModel], surrogate: SurrogateLM | None, settings: EngineSettings,
                      errors: dict[str, str]) -> CalibrationSet | None:
    """The detector directory's calibration.json, when its fits were made for these very models.
    Fits that need the surrogate are left out when it is not loaded (the others still serve)."""
    path = models["detector"].path / CALIBRATION_FILE
    if not path.is_file():
        return None
    where = f"truthlens.models.detector: {path}"
    files = {role: m.path / MODEL_FILE for role, m in models.items()}
    digests = {"surrogate": str(surrogate.manifest.provenance.get("gguf_sha256"))} if surrogate is not None else {}
    try:
        fits = CalibrationSet.load(path).fits
        kept = tuple(c for c in fits if surrogate is not None or "surrogate" not in c.models)
        for cal in kept:
            check_models(cal, files, where, digests)
    except CalibrationError as exc:
        return _load_failed("calibration", str(exc), "scores are reported uncalibrated", settings.strict, errors, exc)
    if not any(c.raw_score == settings.score_method for c in kept):
        log.warning("%s calibrates score_method %s, the config uses %r: scores are reported uncalibrated",
                    where, sorted({c.raw_score for c in fits}), settings.score_method)
    return CalibrationSet(kept) if kept else None
