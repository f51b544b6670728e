"""The committed real-LLM RAG QA set: every line well formed, offsets exact, and the passage join."""

from __future__ import annotations

import json

import pytest

from models.pipelines.hallucination.convert import DEFAULT_DATA
from models.pipelines.hallucination.real_rag import ANSWERS, CATEGORIES, SEVERITIES, QA_FILE, load_answers, real_rag
from models.pipelines.hallucination.records import digest, split_of, validate

KEYS = {"id", "model", "row", "passage_rows", "answer", "labels", "annotator"}


def test_every_line_parses_with_valid_exact_offsets():
    lines = [ln for ln in ANSWERS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert len(lines) >= 100
    ids = set()
    for ln in lines:
        it = json.loads(ln)
        assert KEYS <= set(it), it.get("id")
        assert it["id"] == f"real_rag-{it['model']}-{it['row']}"
        assert it["id"] not in ids
        ids.add(it["id"])
        assert it["model"] in ("smollm2", "gemma3")
        assert len(it["passage_rows"]) == 3 and it["row"] in it["passage_rows"]
        assert it["answer"] == it["answer"].strip()
        assert "question" not in it and "context" not in it  # shared data is joined from ../shared, never copied
        prev_end = -1
        for lab in it["labels"]:
            s, e = lab["start"], lab["end"]
            assert 0 <= s < e <= len(it["answer"]), it["id"]
            assert s > prev_end, f"{it['id']}: unsorted, overlapping or touching labels"
            prev_end = e
            assert it["answer"][s:e] == lab["text"], it["id"]
            assert lab["text"] == lab["text"].strip(), it["id"]
            # whole words: no letter or digit on either side of the span
            assert s == 0 or not (it["answer"][s - 1].isalnum() and it["answer"][s].isalnum()), it["id"]
            assert e == len(it["answer"]) or not (it["answer"][e - 1].isalnum() and it["answer"][e].isalnum()), it["id"]
            assert lab["category"] in CATEGORIES and lab["severity"] in SEVERITIES, it["id"]


def test_context_join_gives_the_three_passages_with_the_rows_own():
    qa = DEFAULT_DATA / QA_FILE
    if not qa.exists():
        pytest.skip(f"shared data not found at {qa}")
    items = {it["id"]: it for it in load_answers()}
    rows = qa.read_text(encoding="utf-8").splitlines()
    recs = list(real_rag(DEFAULT_DATA))
    assert len(recs) == len(items)
    for rec in recs:
        validate(rec)
        it = items[rec["id"]]
        own = json.loads(rows[it["row"]])
        assert rec["question"] == own["question"] and split_of(digest(own["question"]), 0.1) == "dev"
        assert isinstance(rec["context"], list) and len(rec["context"]) == 3
        assert own["knowledge"] in rec["context"]
        assert rec["context"] == [json.loads(rows[k])["knowledge"] for k in it["passage_rows"]]
        assert rec["labels"] == [{"start": lab["start"], "end": lab["end"]} for lab in it["labels"]]
        assert (rec["task"], rec["source"], rec["group"]) == ("rag_qa", "real_rag", digest(own["question"]))


def test_agreement_counts_answers_spans_and_categories():
    from models.pipelines.hallucination.real_rag import agreement

    a = [{"id": "1", "labels": [{"start": 0, "end": 4, "category": "baseless"}]}, {"id": "2", "labels": []},
         {"id": "3", "labels": []}, {"id": "4", "labels": []}]
    b = [{"id": "1", "labels": [{"start": 2, "end": 6, "category": "contradiction"}]},
         {"id": "2", "labels": [{"start": 0, "end": 2, "category": "baseless"}]}, {"id": "3", "labels": []}]
    got = agreement(a, b)
    assert got["items"] == 3  # only what both labelled
    assert got["answer_level_agreement"] == pytest.approx(2 / 3, abs=1e-4) and got["cohen_kappa"] == pytest.approx(0.4)
    assert got["span_char_f1"] == pytest.approx(0.4)  # overlap 2 chars; A covers 4, B covers 6
    assert (got["overlapping_span_pairs"], got["category_agreement"]) == (1, 0.0)
