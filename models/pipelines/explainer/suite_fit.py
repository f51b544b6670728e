"""Suite-fit parts: the real-output suite's human-labelled records that no suite sample reads, as
grounding training files for the verifier (`data.grounding_dir` in models/verifier/train.yaml).

    python -m models.pipelines.explainer.suite_fit            # writes data-cache/suite-fit/<set>.train.jsonl

Why: the verifier has to learn what deployed LLMs' unsupported sentences look like, and the only
human-labelled claims about such answers here are the suite's sets. Most of four of them
(attributionbench, expertqa, frank's CNN/DM half, qags: the converter puts them all in its dev part)
is never read by the suite, which samples 120 records per set and split. This script takes that
remainder and nothing the suite measures with.

A record of attributionbench / expertqa / frank_cnndm / qags is kept when
  - its `suite_split(group)` is "dev" (the suite-test side is never trained on),
  - it is not among the 120 `stable_sample`d suite-dev records (`models.pipelines.hallucination.suite_sets.load_sets`,
    the suite's own code path, so the sample is exactly the suite's),
  - its group is the group of no sampled suite-dev record and of no suite-test record,
  - (stricter than the groups, because sets share sources: attributionbench holds ExpertQA answers,
    QAGS and FRANK both summarise CNN/DM articles, QAGS-XSum the XSum articles) no 10-word shingle of
    its context and no normalised answer sentence (4+ words; boilerplate found in 3+ documents aside) occurs
    in an evaluated record of ANY suite set (the sampled suite-dev and the whole suite-test side of all
    nine sets, FaithDial included),
  - frank only: summary-level labels mark every sentence of an unfaithful summary, so unfaithful
    summaries of more than one sentence are dropped (which sentence is wrong is unknown); faithful
    ones are kept whole.
The converter *train* parts of summedits / xsum / faithbench (never in the suite) are copied next to
them under the same cross-set check, so one `grounding_dir` serves every grounding source.
FaithDial (BEGIN, an independent yardstick) and real_rag (almost nothing left over) give nothing.

Deterministic: the suite's hashes decide everything, records keep the converter's order.
Prints records and sentences per written set; `--stats` only prints.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

from extproc.inference.spans import sentence_bounds
from models import shared
from models.pipelines.hallucination.records import read_jsonl, write_jsonl

FIT_SETS = ("attributionbench", "expertqa", "frank_cnndm", "qags")  # suite sets with a remainder to fit on
TRAIN_PARTS = ("summedits", "xsum", "faithbench")  # converter train parts (not in the suite at all)
SHINGLE = 10
BOILERPLATE_GROUPS = 2
_WORD = re.compile(r"\w+")


def _tokens(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _contexts(rec: dict) -> list[str]:
    return [rec["context"]] if isinstance(rec["context"], str) else list(rec["context"])


def shingles(rec: dict) -> set[int]:
    """Hashes of the context's 10-word shingles (compared within one process only)."""
    out: set[int] = set()
    for ctx in _contexts(rec):
        toks = _tokens(ctx)
        out.update(hash(" ".join(toks[i:i + SHINGLE])) for i in range(0, max(1, len(toks) - SHINGLE + 1)))
    return out


def answer_sentences(rec: dict) -> set[str]:
    ans = rec["answer"]
    return {s for s in (" ".join(_tokens(ans[a:b])) for a, b in sentence_bounds(ans)) if len(s.split()) >= 4}


def leaks(rec: dict, held_shingles: set[int], held_sentences: set[str]) -> bool:
    return bool(answer_sentences(rec) & held_sentences) or bool(shingles(rec) & held_shingles)


def n_sentences(recs: Iterable[dict]) -> tuple[int, int]:
    """(answer sentences, of them overlapping a gold span) as `data.grounding_pairs` counts them."""
    n = bad = 0
    for r in recs:
        gold = [(g["start"], g["end"]) for g in r["labels"]]
        for s, e in sentence_bounds(r["answer"]):
            if len(r["answer"][s:e].strip()) < 8:
                continue
            n += 1
            bad += any(gs < e and ge > s for gs, ge in gold)
    return n, bad


def build(cache: Path, data: Path, per_split: int = 120) -> dict[str, tuple[list[dict], dict[str, int]]]:
    """set name -> (records to train on, counts of what was dropped and why)."""
    from models.pipelines.hallucination.suite_sets import SETS, load_sets

    everything = load_sets(data, cache, list(SETS), None)  # every record, split marked, in stable_sample order
    held: list[dict] = []
    sampled_dev: dict[str, list[dict]] = {}
    for name, recs in everything.items():
        dev = [r for r in recs if r["split"] == "dev"]
        sampled_dev[name] = dev[:per_split]  # load_sets(..., None) keeps stable_sample's order: the suite's cut
        held += sampled_dev[name] + [r for r in recs if r["split"] == "test"]
    held_groups = {str(r["group"]) for r in held}
    held_shingles: set[int] = set()
    groups_of: dict[str, set[str]] = {}
    for r in held:
        held_shingles |= shingles(r)
        for s in answer_sentences(r):
            groups_of.setdefault(s, set()).add(str(r["group"]))
    # a sentence in 3+ held documents is boilerplate ("Here is a concise summary of the passage:"), not a shared source
    held_sentences = {s for s, g in groups_of.items() if len(g) <= BOILERPLATE_GROUPS}

    out: dict[str, tuple[list[dict], dict[str, int]]] = {}
    for name in FIT_SETS:
        recs = everything.get(name, [])
        sampled = {str(r["id"]) for r in sampled_dev.get(name, [])}
        why = {"records": len(recs), "suite_test": 0, "suite_dev_sampled": 0, "held_group": 0, "cross_set": 0,
               "frank_multi_sentence_unfaithful": 0}
        keep = []
        for r in recs:
            if r["split"] != "dev":
                why["suite_test"] += 1
            elif str(r["id"]) in sampled:
                why["suite_dev_sampled"] += 1
            elif str(r["group"]) in held_groups:
                why["held_group"] += 1
            elif leaks(r, held_shingles, held_sentences):
                why["cross_set"] += 1
            elif name == "frank_cnndm" and r["labels"] and len(sentence_bounds(r["answer"])) > 1:
                why["frank_multi_sentence_unfaithful"] += 1
            else:
                keep.append({k: v for k, v in r.items() if k != "split"})
        out[name] = (keep, why)
    for name in TRAIN_PARTS:
        recs = list(read_jsonl(cache / "converted" / f"{name}.train.jsonl"))
        keep = [r for r in recs if str(r["group"]) not in held_groups and not leaks(r, held_shingles, held_sentences)]
        out[name] = (keep, {"records": len(recs), "cross_set": len(recs) - len(keep)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=shared.REPO_ROOT / "data-cache" / "suite", help="the suite's cache")
    ap.add_argument("--data", type=Path, default=shared.SHARED_DATA / "hallucination")
    ap.add_argument("--out", type=Path, default=shared.REPO_ROOT / "data-cache" / "suite-fit")
    ap.add_argument("--stats", action="store_true", help="print the counts, write nothing")
    args = ap.parse_args(argv)
    for name, (recs, why) in build(args.cache, args.data).items():
        n, bad = n_sentences(recs)
        print(f"{name}: {len(recs)} records ({sum(bool(r['labels']) for r in recs)} with spans), "
              f"{n} sentences ({bad} unsupported); from {why}", flush=True)
        if not args.stats:
            write_jsonl(args.out / f"{name}.train.jsonl", recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
