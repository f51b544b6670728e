"""Lexical prefilter in front of the sentinel: decide the obvious prompts without the encoder.

A logistic regression over the lower-cased word unigrams and bigrams (plus the opening word,
the opening word pair and a length bucket) of the prompt's first 48 words. It answers only
outside its confidence band: P(factual) <= `non_factual_below` -> no check,
>= `factual_above` -> check; anything in between goes to the sentinel model. A
"Write a poem" or "Fix this Python function" prompt then costs a few microseconds of regex
and dict lookups instead of an encoder forward pass and two thread hand-offs.

Features are strings (`feature_keys`) and the weights a dict from feature to weight: serving
is one regex pass and one `dict.get` per feature, all inside C loops; a feature unseen in
training weighs nothing. Training (`models/pipelines/sentinel/prefilter.py`) and serving share
`feature_keys`, so they cannot drift; the file records the feature version and a mismatch
refuses to load. The weights live next to the sentinel as `prefilter.npz` (the features as
one UTF-8 text, fp16 weights).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from extproc.inference.manifest import ManifestError

PREFILTER_FILE = "prefilter.npz"
FEATURES = "word-uni-bi-vocab-v2"  # bump when `feature_keys` changes: old weights must not load
MAX_CHARS = 1024  # a huge prompt costs no more than a short one; its opening carries the intent
MAX_WORDS = 48
_WORD = re.compile(r"\w+|[^\w\s]")
_LENGTH = tuple(f"#len{i}" for i in range(MAX_WORDS // 6))  # length buckets of 6 words
_EMPTY = frozenset({"#empty"})
_SEPARATOR = "\n"  # between features in the saved file: no feature contains whitespace but the bigram's space


def feature_keys(text: str) -> set[str]:
    """The prompt's features: words and punctuation marks, adjacent pairs ("who wrote"),
    the opening word ("^who") and pair ("^^who wrote"), and a length bucket."""
    words = _WORD.findall(text[:MAX_CHARS].lower())[:MAX_WORDS]
    if not words:
        return set(_EMPTY)
    keys = set(words)
    keys.update(map(" ".join, zip(words, words[1:])))
    keys.add("^" + words[0])
    if len(words) > 1:
        keys.add(f"^^{words[0]} {words[1]}")
    keys.add(_LENGTH[min(len(words), MAX_WORDS - 1) // 6])
    return keys


def feature_indices(text: str, index: Mapping[str, int]) -> np.ndarray:
    """The prompt's features as indices into a training vocabulary (unknown ones dropped)."""
    return np.fromiter((index[k] for k in feature_keys(text) if k in index), dtype=np.int64)


@dataclass(frozen=True)
class PrefilterBand:
    non_factual_below: float
    factual_above: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.non_factual_below < 0.5 < self.factual_above <= 1.0:
            raise ValueError(f"prefilter band must satisfy 0 <= non_factual_below < 0.5 < factual_above <= 1, "
                             f"got {self.non_factual_below}, {self.factual_above}")


class LexicalPrefilter:
    """Feature weights + band; `decide` returns True/False when confident, None to defer to the model."""

    def __init__(self, weights: Mapping[str, float], bias: float, band: PrefilterBand, meta: dict[str, Any]) -> None:
        self.weights = {k: float(v) for k, v in weights.items() if v}
        self.bias = float(bias)
        self.band = band
        self.meta = meta
        self._get = self.weights.get

    @classmethod
    def from_vocabulary(cls, vocabulary: Iterable[str], weights: np.ndarray, bias: float, band: PrefilterBand,
                        meta: dict[str, Any]) -> LexicalPrefilter:
        """From training's dense weight vector over its feature vocabulary (same order)."""
        return cls(dict(zip(vocabulary, weights.tolist())), bias, band, meta)

    def logit(self, text: str) -> float:
        return sum(map(self._get, feature_keys(text), repeat(0.0))) + self.bias

    def probability(self, text: str) -> float:
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, self.logit(text)))))

    def decide(self, text: str) -> tuple[bool | None, float]:
        """(needs_check or None when unsure, P(factual))."""
        p = self.probability(text)
        if p <= self.band.non_factual_below:
            return False, p
        if p >= self.band.factual_above:
            return True, p
        return None, p

    # ---- persistence ---------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        keys = sorted(self.weights)
        meta = {**self.meta, "features": FEATURES, "non_factual_below": self.band.non_factual_below,
                "factual_above": self.band.factual_above}
        path = Path(directory) / PREFILTER_FILE
        text = _SEPARATOR.join(keys).encode("utf-8")
        with path.open("wb") as fh:
            np.savez_compressed(fh, features=np.frombuffer(text, dtype=np.uint8),
                                values=np.array([self.weights[k] for k in keys], dtype=np.float16),
                                bias=np.float32(self.bias), meta=np.array(json.dumps(meta, sort_keys=True)))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> LexicalPrefilter:
        path = Path(directory) / PREFILTER_FILE
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.get("features") != FEATURES:
                    raise ManifestError(f"{path}: features {meta.get('features')!r}, this TruthLens computes "
                                        f"{FEATURES!r}; retrain it (python -m models.pipelines.sentinel.prefilter) or delete the file")
                text, values, bias = data["features"].tobytes().decode("utf-8"), data["values"], float(data["bias"])
        except ManifestError:
            raise
        except (OSError, KeyError, ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{path}: not a TruthLens prefilter file ({exc})") from exc
        keys = text.split(_SEPARATOR) if text else []
        if len(keys) != values.shape[0]:
            raise ManifestError(f"{path}: {values.shape[0]} weights for {len(keys)} features")
        try:
            band = PrefilterBand(float(meta["non_factual_below"]), float(meta["factual_above"]))
        except (KeyError, ValueError) as exc:
            raise ManifestError(f"{path}: bad confidence band ({exc})") from exc
        return cls(dict(zip(keys, values.astype(np.float64).tolist())), bias, band, meta)
