"""Training pairs for the grounding verifier: (context window, answer sentence) -> supported or not.

Two kinds of item, one model (3-way NLI head, so it also serves as the explainer):
  - NLI pairs (the explainer's sources): entailment / neutral / contradiction, full 3-way loss;
  - grounding pairs from span-labelled answers (the converter's *train* parts only): every answer
    sentence against the context window serving would score it on; a sentence overlapping a gold
    span is "not supported" (loss on P(entailment) alone: the data rarely says whether it is
    neutral or contradicting), any other sentence "supported" (entailment).
A sentence is paired with the context window that shares most words with it, as serving's
max-over-windows reads the best window: a supported sentence must be entailed by its best
window, an unsupported one by none, so the hardest window is the one to learn from.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, Iterator

from extproc.inference.spans import sentence_bounds
from models.data.records import read_jsonl

NOT_SUPPORTED = 3  # label index past the three NLI labels: "anything but entailment"
_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2}


def context_windows(context: str, max_words: int, overlap: int = 30) -> list[str]:
    """Word windows of the context (a cheap stand-in for serving's token windows)."""
    words = context.split()
    if len(words) <= max_words:
        return [context]
    step = max(1, max_words - overlap)
    return [" ".join(words[i:i + max_words]) for i in range(0, max(1, len(words) - overlap), step)]


def grounding_pairs(rec: dict[str, Any], max_words: int) -> Iterator[tuple[str, str, int]]:
    """(window, sentence, label) for every sentence of one span-labelled answer."""
    ctx = rec["context"] if isinstance(rec["context"], str) else "\n\n".join(rec["context"])
    windows = context_windows(ctx, max_words)
    gold = [(s["start"], s["end"]) for s in rec["labels"]]
    answer = rec["answer"]
    for s, e in sentence_bounds(answer):
        sentence = answer[s:e].strip()
        if len(sentence) < 8:
            continue
        bad = any(gs < e and ge > s for gs, ge in gold)
        words = _words(sentence)
        best = max(windows, key=lambda w: len(words & _words(w)))
        yield best, sentence, (NOT_SUPPORTED if bad else 0)


def load_grounding(sources: dict[str, int], data_dir: Path, max_words: int, rng: random.Random
                   ) -> list[tuple[str, str, int, str]]:
    """Sentence pairs from `<data_dir>/<source>.train.jsonl`, at most `cap` per source."""
    out: list[tuple[str, str, int, str]] = []
    for src, cap in sources.items():
        path = data_dir / f"{src}.train.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing: run python -m models.data.convert --sources {src}")
        pairs = [(p, h, y, src) for rec in read_jsonl(path) for p, h, y in grounding_pairs(rec, max_words)]
        out += rng.sample(pairs, cap) if cap and len(pairs) > cap else pairs
    return out
