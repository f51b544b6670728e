"""Detector inputs, built with the serving code's template and windowing.

Training rows come from `extproc.inference.windowing.detector_input`, the function the
gateway runs, so the text layout, special tokens and context windows are identical at
training and serving time. Labels: 1 = hallucinated answer token, 0 = supported answer
token, -100 for context, question and special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tokenizers import Tokenizer

from extproc.inference.manifest import DEFAULT_TEMPLATES
from extproc.inference.windowing import PairInput, PairLayout, Row, detector_input, prepare_tokenizer, probe_layout
from models.shared import Example

LABELS = ["supported", "hallucinated"]
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
