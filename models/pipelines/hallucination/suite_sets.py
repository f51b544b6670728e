"""The real-output suite's sets: which converted source each is, and how its records are split and sampled.

Shared by the suite (`bench/real_output_suite.py`) and the suite-fit training parts
(`models/pipelines/explainer/suite_fit.py`), which must read exactly the suite's samples to leave them out.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from extproc.evaluation.suite import stable_sample, suite_split

# set -> (converter source, id prefix filter or None, what)
SETS: dict[str, tuple[str, str | None, str]] = {
    "faithbench": ("faithbench", None, "LLM summaries, annotator spans"),
    "xsum": ("xsum", None, "XSum system summaries, annotator spans"),
    # FRANK's XSum half repeats the xsum set's summaries (part of them in xsum's training split): left out
    "frank_cnndm": ("frank", "frank-cnndm", "FRANK CNN/DM system summaries, summary level"),
    "qags": ("qags", None, "QAGS system summaries, majority-unfaithful sentences"),
    "summedits": ("summedits", None, "SummEdits edited summaries, edit spans"),
    "expertqa": ("expertqa", None, "ExpertQA GPT-4 answers, expert claim support"),
    "attributionbench": ("attributionbench", None, "HAGRID / Bing Chat / Perplexity sentences, attribution"),
    "real_rag": ("real_rag", None, "SmolLM2 / Gemma 3 RAG answers generated here, guide-labelled"),
    "faithdial": ("faithdial", None, "dialogue replies (BEGIN audit): report only"),
}


def load_sets(data: Path, cache: Path, names: Sequence[str], per_split: int | None) -> dict[str, list[dict]]:
    """name -> records (with `split`), converted once into the cache."""
    from models.pipelines.hallucination.convert import DEV_FRACTION, SOURCES, convert
    from models.pipelines.hallucination.records import read_jsonl

    out: dict[str, list[dict]] = {}
    for name in names:
        source, prefix, _ = SETS[name]
        if source not in SOURCES:
            print(f"{name}: converter {source!r} not available, skipped", file=sys.stderr)
            continue
        conv = cache / "converted" / f"{source}.dev.jsonl"
        if not conv.is_file():
            try:
                convert(source, data, cache / "converted", DEV_FRACTION.get(source))
            except FileNotFoundError as exc:
                print(f"{name}: {exc}; skipped", file=sys.stderr)
                continue
        recs = [r for r in read_jsonl(conv) if prefix is None or str(r["id"]).startswith(prefix)]
        train = conv.with_name(f"{source}.train.jsonl")
        if train.is_file():  # faithbench's converter groups by summary: drop dev answers about a training article
            seen = {_doc_key(r) for r in read_jsonl(train)}
            recs = [r for r in recs if _doc_key(r) not in seen]
        for r in recs:
            r["split"] = suite_split(str(r["group"]))
        out[name] = [r for split in ("dev", "test")
                     for r in stable_sample([r for r in recs if r["split"] == split], per_split)]
    return out


def _doc_key(rec: dict) -> str:
    return " ".join("\n\n".join(context_of(rec)).split())[:300]


def context_of(rec: dict) -> list[str]:
    ctx = rec["context"]
    return [ctx] if isinstance(ctx, str) else list(ctx)
