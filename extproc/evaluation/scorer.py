"""The model side of `truthlens eval` / `truthlens detect`: the serving engine, run offline.

Examples go through `OnnxEngine.detect`, the exact path the gateway uses
(windowing, batcher, span filter, NLI dropping), so eval numbers describe what
users get. Token-level F1 and AUROC also need the raw per-token probabilities,
which `DetectionResult` does not carry; `_TokenTap` wraps the engine's detector
and keeps the `TokenScores` of the call in progress instead of running the
detector a second time. Examples are scored one at a time, so latency is the
single-request latency, not a batched average.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, replace
from typing import Any, Sequence

from extproc.evaluation.dataset import Example
from extproc.evaluation.runner import PredictedSpan, Prediction

DEFAULT_DETECTOR = "models/detector"
DEFAULT_EXPLAINER = "models/explainer"


class ScorerError(Exception):
    """The models could not be loaded or the detector failed on an input."""


class _TokenTap:
    """Delegates to the engine's Detector and remembers the last `finish` result."""

    def __init__(self, detector: Any) -> None:
        self._detector = detector
        self.last: Any = None

    def prepare(self, *args: Any) -> Any:
        return self._detector.prepare(*args)

    def finish(self, *args: Any) -> Any:
        self.last = self._detector.finish(*args)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._detector, name)


def settings_from_args(args: argparse.Namespace) -> tuple[Any, float]:
    """(EngineSettings, thresholds.response): config or the documented defaults, then the command-line dirs."""
    from extproc.config import ConfigError, default_config, load_config
    from extproc.inference.engine import EngineSettings

    if getattr(args, "config", None):
        try:
            cfg = load_config(args.config)
        except ConfigError as exc:
            raise ScorerError(f"invalid config {args.config}:\n" + "\n".join(exc.errors)) from exc
    else:
        cfg = default_config()
    settings = EngineSettings.from_config(cfg)
    detector = args.model_dir or (settings.detector_dir if args.config else None) or DEFAULT_DETECTOR
    explainer = args.explainer_dir or (settings.explainer_dir if args.config else None) or DEFAULT_EXPLAINER
    no_explainer = bool(getattr(args, "no_explainer", False))
    engine_settings = replace(
        settings,
        sentinel_dir=None,  # eval and detect judge answers; the prompt classifier is not involved
        detector_dir=detector,
        gpu_detector_dir=None if args.model_dir else settings.gpu_detector_dir,  # --model-dir: that model everywhere
        explainer_dir=None if no_explainer else explainer,
        explainer_enabled=settings.explainer_enabled and not no_explainer,
    )
    for flag, field_name in (("token_threshold", "token_threshold"), ("min_span_confidence", "min_span_confidence")):
        value = getattr(args, flag, None)
        if value is not None:
            if not 0.0 <= value <= 1.0:
                raise ScorerError(f"--{flag.replace('_', '-')}: expected a probability in [0, 1], got {value}")
            engine_settings = replace(engine_settings, **{field_name: float(value)})
    return engine_settings, float(cfg.truthlens.thresholds.response)


def open_scorer(args: argparse.Namespace) -> "Scorer":
    settings, response_threshold = settings_from_args(args)
    return Scorer(settings, response_threshold)


class Scorer:
    """Owns one engine and one event loop for the whole run."""

    def __init__(self, settings: Any, response_threshold: float = 0.5) -> None:
        from extproc.inference.engine import build_engine
        from extproc.inference.manifest import ManifestError
        from extproc.inference.runtime import ProviderUnavailable

        self.settings = settings
        self.response_threshold = response_threshold
        self._loop = asyncio.Runner()
        try:
            self.engine = build_engine(settings)
        except (ManifestError, ProviderUnavailable) as exc:
            self._loop.close()
            raise ScorerError(str(exc)) from exc
        if not self.engine.has("detector"):
            self.close()
            raise ScorerError(
                f"detector model directory {settings.detector_dir!r} not found "
                "(pass --model-dir or set truthlens.models.detector in --config)"
            )
        self._tap = _TokenTap(self.engine.detector)
        self.engine.detector = self._tap  # type: ignore[assignment]

    @property
    def token_threshold(self) -> float:
        return float(self.settings.token_threshold)

    def _run(self, context: Sequence[str], question: str | None, answer: str, where: str = "input") -> Any:
        try:
            return self._loop.run(self.engine.detect(context, question, answer))
        except Exception as exc:  # noqa: BLE001 - any failure ends the run; say which example caused it
            raise ScorerError(f"{where}: detector failed: {type(exc).__name__}: {exc}") from exc

    def warm_up(self, ex: Example) -> None:
        """One untimed call: first-call costs (session arenas, thread pools) are not per-example latency."""
        self.score(ex)

    def score(self, ex: Example) -> Prediction:
        """One example as the gateway judges it; one over the request budget is what the gateway would pass
        unchecked (`unchecked="too_large"`: nothing flagged, score 0), not the end of the run."""
        from extproc.inference.api import TooLarge

        self._tap.last = None
        t0 = time.perf_counter()
        try:
            result = self._run(ex.context, ex.question, ex.answer, f"example {ex.id!r} (line {ex.line})")
        except ScorerError as exc:
            if isinstance(exc.__cause__, TooLarge):
                return Prediction((), 0.0, (), (), 0, (time.perf_counter() - t0) * 1000, unchecked="too_large")
            raise
        tokens = self._tap.last
        if tokens is None:  # empty answer or an engine that bypassed the tap: no token evidence
            offsets: tuple[tuple[int, int], ...] = ()
            probs: tuple[float, ...] = ()
        else:
            offsets = tuple((int(s), int(e)) for s, e in tokens.offsets)
            probs = tuple(float(p) for p in tokens.probs)
        spans = tuple(
            PredictedSpan(s.start, s.end, s.text, float(s.score), s.nli_label, s.nli_confidence) for s in result.spans
        )
        return Prediction(spans, float(result.score), offsets, probs, result.windows, float(result.latency_ms))

    def detect(self, context: Sequence[str], question: str | None, answer: str) -> dict[str, Any]:
        """The `truthlens detect` JSON document."""
        self._tap.last = None
        result = self._run(context, question, answer)
        tokens = self._tap.last
        max_prob = float(tokens.probs.max()) if tokens is not None and len(tokens.probs) else 0.0
        return {
            "score": result.score,
            "detected": result.score >= self.response_threshold,
            "response_threshold": self.response_threshold,
            "max_token_prob": max_prob,
            "spans": [asdict(s) for s in result.spans],
            "windows": result.windows,
            "dropped_spans": result.dropped_spans,
            "latency_ms": result.latency_ms,
            "timings_ms": result.timings_ms,
            "signals": list(result.signals),
            "models": [asdict(m) for m in self.engine.models()],
        }

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "detector_dir": next((m.path for m in self.engine.models() if m.role == "detector"), s.detector_dir),
            "explainer_dir": s.explainer_dir,
            "explainer": "on" if self.engine.has("explainer") else "off",
            "models": [asdict(m) for m in self.engine.models()],
            "thresholds": {
                "token": s.token_threshold,
                "response": self.response_threshold,
                "nli_entailment": s.nli_entailment_threshold,
                "min_span_tokens": s.min_span_tokens,
                "min_span_chars": s.min_span_chars,
                "min_span_confidence": s.min_span_confidence,
            },
            "drop_entailed": s.drop_entailed,
            "score_method": s.score_method,
            "max_wait_ms": s.max_wait_ms,
        }

    def close(self) -> None:
        try:
            self._loop.run(self.engine.close())
        finally:
            self._loop.close()
