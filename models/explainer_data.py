"""NLI sources for the explainer, one loader per dataset under ../shared/data/nli.

Every loader returns {"train": [...], "test": [...]} of (premise, hypothesis, label) with
label in entailment | neutral | contradiction. Test parts are never trained on:
  - sets shipped with their own splits use them (SNLI dev->train / test->test, SICK, CAD, FEVER-sym);
  - single-file sets are split by premise (no premise in both parts): MNLI (TaxiNLI), ANLI dev;
  - ConjNLI trains on its adversarial file and tests on the human dev set;
  - Breaking-NLI is test-only.
taxinli10k_MNLIDev.tsv is NOT read: it is a subset of taxinli10k.tsv (duplicate rows).
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Callable, Iterator

Pair = tuple[str, str, str]
Split = dict[str, list[Pair]]
LABELS = ("entailment", "neutral", "contradiction")
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
