"""Explainer data: NLI sources (one loader per dataset under ../shared/data/nli), the verifier's
grounding pairs and the splits.

Every loader returns {"train": [...], "test": [...]} of (premise, hypothesis, label) with
label in entailment | neutral | contradiction. Test parts are never trained on:
  - sets shipped with their own splits use them (SNLI dev->train / test->test, SICK, CAD, FEVER-sym);
  - single-file sets are split by premise (no premise in both parts): MNLI (TaxiNLI), ANLI dev;
  - ConjNLI trains on its adversarial file and tests on the human dev set;
  - Breaking-NLI is test-only.
taxinli10k_MNLIDev.tsv is NOT read: it is a subset of taxinli10k.tsv (duplicate rows).

A config with `data.grounding` (models/verifier/train.yaml) also trains on grounding pairs:
(context window, answer sentence) -> supported or not. Two kinds of item, one model (3-way NLI
head, so it also serves as the explainer):
  - NLI pairs (the sources above): entailment / neutral / contradiction, full 3-way loss;
  - grounding pairs from span-labelled answers (never a suite sample: the converter's *train* parts, or with
    `data.grounding_dir` the suite-fit parts `suite_fit.py` writes): every answer
    sentence against the context window serving would score it on; a sentence overlapping a gold
    span is "not supported" (loss on P(entailment) alone: the data rarely says whether it is
    neutral or contradicting), any other sentence "supported" (entailment).
A sentence is paired with the context window that shares most words with it, as serving's
max-over-windows reads the best window: a supported sentence must be entailed by its best
window, an unsupported one by none, so the hardest window is the one to learn from.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any, Callable, Iterator

from extproc.inference.spans import sentence_bounds
from models import shared
from models.pipelines.hallucination.records import read_jsonl

Pair = tuple[str, str, str]
Split = dict[str, list[Pair]]
LABELS = ("entailment", "neutral", "contradiction")
NOT_SUPPORTED = 3  # label index past the three NLI labels: "anything but entailment"
Item = tuple[str, str, int, str]  # (premise, hypothesis, label index, source)
_MAP = {"e": "entailment", "n": "neutral", "c": "contradiction",
        "supports": "entailment", "refutes": "contradiction"}


def _label(raw: str) -> str | None:
    x = raw.strip().lower()
    x = _MAP.get(x, x)
    return x if x in LABELS else None


def _by_premise(pairs: list[Pair], test_share: float) -> Split:
    """Deterministic premise-grouped split: a premise's pairs all land on the same side."""
    out: Split = {"train": [], "test": []}
    for p in pairs:
        h = int(hashlib.sha1(p[0].encode("utf-8")).hexdigest()[:8], 16) / 0xFFFFFFFF
        out["test" if h < test_share else "train"].append(p)
    return out


def _tsv(path: Path) -> Iterator[dict[str, str]]:
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8-sig", newline="") as fh:
        yield from csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)


def _rows(rows, p: str, h: str, y: str) -> list[Pair]:
    out = []
    for r in rows:
        lab = _label(r.get(y) or "")
        if lab and r.get(p) and r.get(h):
            out.append((r[p].strip(), r[h].strip(), lab))
    return out


def mnli(d: Path) -> Split:
    return _by_premise(_rows(_tsv(d / "taxinli" / "taxinli10k.tsv"), "prem", "hyp", "label"), 0.15)


def _esnli(d: Path, part: str) -> list[Pair]:
    def lines(name: str) -> list[str]:
        return (d / "esnli" / f"{name}.{part}").read_text(encoding="utf-8").splitlines()

    return [(p.strip(), h.strip(), y.strip()) for p, h, y in zip(lines("s1"), lines("s2"), lines("labels"))
            if _label(y)]


def snli(d: Path) -> Split:
    return {"train": _esnli(d, "dev"), "test": _esnli(d, "test")}


def anli(d: Path) -> Split:
    pairs: list[Pair] = []
    for r in (1, 2, 3):
        with open(d / "anli" / f"ANLI_analysis_r{r}_dev.csv", encoding="utf-8", newline="") as fh:
            pairs += _rows(csv.DictReader(fh), "context", "statement", "gold_label")
    return _by_premise(pairs, 0.4)


def sick(d: Path) -> Split:
    def read(name: str) -> list[Pair]:
        return _rows(_tsv(d / "sick2014" / name), "sentence_A", "sentence_B", "entailment_judgment")

    return {"train": read("SICK_train.txt") + read("SICK_trial.txt"), "test": read("SICK_test_annotated.txt")}


def cad_snli(d: Path) -> Split:
    out: Split = {"train": [], "test": []}
    for variant in ("original", "revised_premise", "revised_hypothesis"):
        out["train"] += _rows(_tsv(d / "cad_snli" / variant / "train.tsv"), "sentence1", "sentence2", "gold_label")
        out["test"] += _rows(_tsv(d / "cad_snli" / variant / "test.tsv"), "sentence1", "sentence2", "gold_label")
    return out


def conjnli(d: Path) -> Split:
    return {"train": _rows(_tsv(d / "conjnli" / "adversarial_train_15k.tsv"), "Premise", "Hypothesis", "Label"),
            "test": _rows(_tsv(d / "conjnli" / "conj_dev.tsv"), "Premise", "Hypothesis", "Label")}


def _jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def fever_symmetric(d: Path) -> Split:
    """2-way (SUPPORTS/REFUTES): no neutral pairs, so accuracy here ignores 'not enough info'."""
    def read(name: str) -> list[Pair]:
        return _rows(_jsonl(d / "fever_symmetric" / name), "evidence", "claim", "gold_label")

    return {"train": read("fever_symmetric_dev.jsonl"), "test": read("fever_symmetric_test.jsonl")}


def breaking_nli(d: Path) -> Split:
    return {"train": [], "test": _rows(_jsonl(d / "breaking_nli" / "data" / "dataset.jsonl"),
                                       "sentence1", "sentence2", "gold_label")}


LOADERS: dict[str, Callable[[Path], Split]] = {
    fn.__name__: fn for fn in (mnli, snli, anli, sick, cad_snli, conjnli, fever_symmetric, breaking_nli)
}


def load_source(name: str, data_dir: Path) -> Split:
    if name not in LOADERS:
        raise KeyError(f"unknown explainer source {name!r}; known: {sorted(LOADERS)}")
    split = LOADERS[name](data_dir)
    # Exact duplicates of a test pair are dropped from train (CAD revisions repeat some pairs).
    test_keys = {(p.lower(), h.lower()) for p, h, _ in split["test"]}
    split["train"] = [x for x in split["train"] if (x[0].lower(), x[1].lower()) not in test_keys]
    return split


# ---------------------------------------------------------------- grounding pairs (the verifier)

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
            raise FileNotFoundError(f"{path} missing: run python -m models.pipelines.hallucination.convert --sources {src}")
        pairs = [(p, h, y, src) for rec in read_jsonl(path) for p, h, y in grounding_pairs(rec, max_words)]
        out += rng.sample(pairs, cap) if cap and len(pairs) > cap else pairs
    return out


# ---------------------------------------------------------------- splits


def build_splits(cfg: dict[str, Any], data_dir: Path) -> dict[str, list[Item]]:
    """Training mix (per-source caps) and per-source held-out test samples."""
    rng = random.Random(cfg["seed"])
    data = cfg["data"]
    train: list[Item] = []
    test: list[Item] = []
    for src in sorted(set(data["train"]) | set(data["test"])):
        split = load_source(src, data_dir)

        def take(pairs: list[Pair], cap: int | None) -> list[Pair]:
            return rng.sample(pairs, cap) if cap and len(pairs) > cap else list(pairs)

        if src in data["train"]:
            train += [(p, h, LABELS.index(y), src) for p, h, y in take(split["train"], data["train"][src])]
        if src in data["test"]:
            test += [(p, h, LABELS.index(y), src) for p, h, y in take(split["test"], data["test"][src])]
    grounding = data.get("grounding") or {}
    if grounding:
        train += load_grounding(grounding, Path(data.get("grounding_dir", shared.REPO_ROOT / "data-cache/hallucination")),
                                int(cfg.get("premise_words", 160)), rng)
    rng.shuffle(train)
    return {"train": train, "test": test}
