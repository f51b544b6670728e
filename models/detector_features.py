"""Detector inputs and dev metrics, built with the serving code's template and windowing.

Training rows come from `extproc.inference.windowing.detector_input`, the function the
gateway runs, so the text layout, special tokens and context windows are identical at
training and serving time. Labels: 1 = hallucinated answer token, 0 = supported answer
token, -100 for context, question and special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer

from extproc.inference.manifest import DEFAULT_TEMPLATES
from extproc.inference.windowing import (
    PairInput, PairLayout, Row, aggregate_windows, detector_input, prepare_tokenizer, probe_layout,
)
from models.common import Example

TEMPLATE: dict[str, str] = dict(DEFAULT_TEMPLATES["token-classification"])


@dataclass
class Featurizer:
    tokenizer: Tokenizer
    layout: PairLayout
    template: Mapping[str, str]
    overlap: int = 64

    @classmethod
    def from_file(cls, tokenizer_json: str, overlap: int = 64) -> "Featurizer":
        tok = prepare_tokenizer(Tokenizer.from_file(tokenizer_json))
        return cls(tok, probe_layout(tok), TEMPLATE, overlap)

    def pair(self, rec: Mapping[str, Any], max_length: int) -> PairInput:
        ctx = rec["context"]
        passages = [ctx] if isinstance(ctx, str) else list(ctx)
        return detector_input(self.tokenizer, self.layout, self.template, passages,
                              rec.get("question"), rec["answer"], max_length, self.overlap)


def token_labels(offsets: Sequence[tuple[int, int]], spans: Sequence[Mapping[str, int]]) -> list[int]:
    """1 when a token's characters overlap a gold span; -100 for empty-offset tokens."""
    out = []
    for s, e in offsets:
        if e <= s:
            out.append(-100)
        else:
            out.append(int(any(s < sp["end"] and e > sp["start"] for sp in spans)))
    return out


def _overlap(row: Row, answer_ids: set[int]) -> int:
    return len(set(row.input_ids[: row.second_start]) & answer_ids)


def training_example(feat: Featurizer, rec: Mapping[str, Any], max_length: int) -> Example:
    """One row per record: when the context needs several windows, the one sharing most
    vocabulary with the answer (where the evidence most likely is) carries the labels."""
    pin = feat.pair(rec, max_length)
    labels = token_labels(pin.second_offsets, rec["labels"])
    rows = pin.rows
    if len(rows) > 1:
        chunk0 = [r for r in rows if r.second_first == 0]
        ans = set(chunk0[0].input_ids[chunk0[0].second_start: chunk0[0].second_start + chunk0[0].second_count])
        row = max(chunk0, key=lambda r: _overlap(r, ans))
    else:
        row = rows[0]
    y = [-100] * len(row.input_ids)
    for k in range(row.second_count):
        y[row.second_start + k] = labels[row.second_first + k]
    meta = {"id": rec["id"], "source": rec.get("source", ""), "windows": len(rows)}
    return Example(list(row.input_ids), list(row.type_ids), y, meta)


# ---------------------------------------------------------------- evaluation


def aggregate(pin: PairInput, row_probs: Sequence[np.ndarray], how: str) -> np.ndarray:
    """Per answer token probability over all rows: "min" is the runtime's evidence-aware rule
    (`aggregate_windows`: min over context windows), "max" the rule it replaced, kept for comparison."""
    if how == "min":
        return aggregate_windows(pin, row_probs)
    agg = np.zeros(pin.second_len, dtype=np.float32)
    for row, p in zip(pin.rows, row_probs):
        seg = p[row.second_start: row.second_start + row.second_count]
        tgt = agg[row.second_first: row.second_first + row.second_count]
        np.maximum(tgt, seg, out=tgt)
    return agg


def predicted_spans(offsets: Sequence[tuple[int, int]], probs: np.ndarray, t: float) -> list[tuple[int, int]]:
    """Merge flagged tokens into character spans (adjacent or whitespace-separated tokens join)."""
    spans: list[list[int]] = []
    for (s, e), p in zip(offsets, probs):
        if e <= s or p < t:
            continue
        if spans and s - spans[-1][1] <= 1:
            spans[-1][1] = e
        else:
            spans.append([s, e])
    return [(s, e) for s, e in spans]


def auroc(scores: Sequence[float], gold: Sequence[int]) -> float | None:
    """Mann-Whitney U with average ranks; None for a single-class set."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(gold, dtype=int)
    npos, nneg = int(y.sum()), int(len(y) - y.sum())
    if npos == 0 or nneg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i: j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y == 1].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def _f1(tp: float, fp: float, fn: float) -> dict[str, float | None]:
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    f = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return {"precision": None if p is None else round(p, 4), "recall": None if r is None else round(r, 4),
            "f1": None if f is None else round(f, 4)}


def metrics_at(items: Sequence[dict[str, Any]], t: float) -> dict[str, Any]:
    """Example-level P/R/F1, pooled character-span P/R/F1 and AUROC for one threshold.

    items: {"answer_len", "gold": [(s, e)], "offsets", "probs"} per dev record.
    """
    tp = fp = fn = tn = 0
    inter = pred_chars = gold_chars = 0
    for it in items:
        spans = predicted_spans(it["offsets"], it["probs"], t)
        g, p = bool(it["gold"]), bool(spans)
        tp += g and p
        fp += p and not g
        fn += g and not p
        tn += not g and not p
        gmask = np.zeros(it["answer_len"], dtype=bool)
        pmask = np.zeros(it["answer_len"], dtype=bool)
        for s, e in it["gold"]:
            gmask[s:e] = True
        for s, e in spans:
            pmask[s:e] = True
        inter += int((gmask & pmask).sum())
        pred_chars += int(pmask.sum())
        gold_chars += int(gmask.sum())
    scores = [float(it["probs"].max()) if len(it["probs"]) else 0.0 for it in items]
    au = auroc(scores, [int(bool(it["gold"])) for it in items])
    return {
        "n": len(items), "positives": tp + fn,
        "example_level": {**_f1(tp, fp, fn), "tp": tp, "fp": fp, "fn": fn, "tn": tn},
        "span_level_char": _f1(inter, pred_chars - inter, gold_chars - inter),
        "auroc": None if au is None else round(au, 4),
    }
