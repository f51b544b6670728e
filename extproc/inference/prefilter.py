"""Lexical prefilter in front of the sentinel: decide the obvious prompts without the encoder.

A logistic regression over hashed lower-cased word unigrams and bigrams (plus the
opening word pair and a length bucket) of the prompt's first 48 words. It answers only
outside its confidence band: P(factual) <= `non_factual_below` -> no check,
>= `factual_above` -> check; anything in between goes to the sentinel model. A
"Write a poem" or "Fix this Python function" prompt then costs about 10 microseconds
of regex and CRC32 instead of an encoder forward pass and two thread hand-offs.

Training (`models/train_prefilter.py`) and serving share `features`, so they cannot
drift; the file records the feature version and a mismatch refuses to load. The weights
live next to the sentinel as `prefilter.npz` (sparse: indices + fp16 values).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from extproc.inference.manifest import ManifestError

PREFILTER_FILE = "prefilter.npz"
FEATURES = "word-uni-bi-crc32-v1"  # bump when `features` changes: old weights must not load
MAX_CHARS = 1024  # a huge prompt costs no more than a short one; its opening carries the intent
MAX_WORDS = 48
_WORD = re.compile(r"\w+|[^\w\s]")


def feature_set(text: str, buckets: int) -> set[int]:
    """Hashed feature indices of a prompt (stable across processes: CRC32, no hash salt)."""
    words = _WORD.findall(text[:MAX_CHARS].lower())[:MAX_WORDS]
    if not words:
        return {0}
    h = [zlib.crc32(w.encode()) for w in words]
    n = len(h)
    feats = {f % buckets for f in h}
    if n > 1:
        feats.update([(a * 1_000_003 + b) % buckets for a, b in zip(h, h[1:])])
        feats.add((h[0] * 104_729 + h[1] * 31 + 5) % buckets)  # the opening word pair
    feats.add((h[0] * 7_919 + 17) % buckets)  # the opening word: "write", "who", "fix", ...
    feats.add((min(n, MAX_WORDS - 1) // 6 * 7 + 3) % buckets)  # length bucket
    return feats


def features(text: str, buckets: int) -> np.ndarray:
    """`feature_set` as a unique index array, the form training indexes weights with."""
    return np.fromiter(feature_set(text, buckets), dtype=np.int64)


@dataclass(frozen=True)
class PrefilterBand:
    non_factual_below: float
    factual_above: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.non_factual_below < 0.5 < self.factual_above <= 1.0:
            raise ValueError(f"prefilter band must satisfy 0 <= non_factual_below < 0.5 < factual_above <= 1, "
                             f"got {self.non_factual_below}, {self.factual_above}")


class LexicalPrefilter:
    """Weights + band; `decide` returns True/False when confident, None to defer to the model."""

    def __init__(self, weights: np.ndarray, bias: float, band: PrefilterBand, meta: dict[str, Any]) -> None:
        self.weights = weights.astype(np.float32, copy=False)
        self.buckets = int(weights.shape[0])
        self.bias = float(bias)
        self.band = band
        self.meta = meta
        # Serving sums a dozen weights per prompt: plain indexing into an array of doubles does
        # that in about a microsecond, where numpy's per-call overhead alone costs several.
        self._lookup = array("d", self.weights.tolist()).__getitem__

    def probability(self, text: str) -> float:
        z = sum(map(self._lookup, feature_set(text, self.buckets))) + self.bias
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

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
        nz = np.flatnonzero(self.weights)
        meta = {**self.meta, "features": FEATURES, "buckets": self.buckets,
                "non_factual_below": self.band.non_factual_below, "factual_above": self.band.factual_above}
        path = Path(directory) / PREFILTER_FILE
        with path.open("wb") as fh:
            np.savez_compressed(fh, indices=nz.astype(np.int32), values=self.weights[nz].astype(np.float16),
                                bias=np.float32(self.bias), meta=np.array(json.dumps(meta, sort_keys=True)))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> "LexicalPrefilter":
        path = Path(directory) / PREFILTER_FILE
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                indices, values, bias = data["indices"], data["values"], float(data["bias"])
        except (OSError, KeyError, ValueError) as exc:
            raise ManifestError(f"{path}: not a TruthLens prefilter file ({exc})") from exc
        if meta.get("features") != FEATURES:
            raise ManifestError(f"{path}: features {meta.get('features')!r}, this TruthLens computes {FEATURES!r}; "
                                "retrain it (python -m models.train_prefilter) or delete the file")
        buckets = int(meta.get("buckets", 0))
        if buckets <= 0 or (indices.size and int(indices.max()) >= buckets) or indices.shape != values.shape:
            raise ManifestError(f"{path}: {indices.size} weights do not fit {buckets} buckets")
        try:
            band = PrefilterBand(float(meta["non_factual_below"]), float(meta["factual_above"]))
        except (KeyError, ValueError) as exc:
            raise ManifestError(f"{path}: bad confidence band ({exc})") from exc
        weights = np.zeros(buckets, dtype=np.float32)
        weights[indices] = values.astype(np.float32)
        return cls(weights, bias, band, meta)
