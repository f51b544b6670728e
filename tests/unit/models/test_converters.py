"""Converters and synthetic spans on tiny generated copies of the shared data layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from models.pipelines.hallucination import convert, synthetic
from models.pipelines.hallucination.records import digest, make_record, merge_spans, read_jsonl, split_of, validate


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


QA_ROWS = [
    {"knowledge": "The Oberoi Group is a hotel company with its head office in Delhi. It was founded in 1934 "
                  "by Mohan Singh Oberoi.",
     "question": "The Oberoi family is part of a hotel company that has a head office in what city?",
     "right_answer": "Delhi", "hallucinated_answer": "The Oberoi family's hotel company is based in Mumbai."},
    {"knowledge": "Arthur's Magazine (1844-1846) was an American literary periodical published in Philadelphia. "
                  "First for Women is a woman's magazine published by Bauer Media Group in the USA.",
     "question": "Which magazine was started first Arthur's Magazine or First for Women?",
     "right_answer": "Arthur's Magazine", "hallucinated_answer": "First for Women was started first."},
    {"knowledge": "Dawn Roma French (born 11 October 1957) is an English actress, writer, and comedian. "
                  "She starred in Girls on Top with Jennifer Saunders.",
     "question": "When was the comedian from Girls on Top born?",
     "right_answer": "11 October 1957", "hallucinated_answer": "She was born on 3 May 1961 in London."},
]


@pytest.fixture()
def shared(tmp_path: Path) -> Path:
    root = tmp_path / "hallucination"
    _write_jsonl(root / "halueval/eval_suite/dataset_halueval_qa.jsonl", QA_ROWS)
    summary = " The film grossed $181 million, with a production budget of $160 million."
    fb = {"samples": [
        {"sample_id": 0, "source": "Poseidon grossed $181 million on a budget of $160 million.", "summary": summary,
         "annotations": [
             {"label": ["Unwanted", "Unwanted.Intrinsic"], "summary_start": summary.index("production"),
              "summary_end": summary.index("production") + len("production")},
             {"label": ["Benign"], "summary_start": 1, "summary_end": 9}]},
        {"sample_id": 1, "source": "Another source.", "summary": "A faithful summary.", "annotations": []},
    ]}
    (root / "faithbench/data_for_release").mkdir(parents=True)
    (root / "faithbench/data_for_release/batch_1.json").write_text(json.dumps(fb), encoding="utf-8")
    xs = root / "xsum_hallucination_annotations"
    xs.mkdir()
    s = "rory mcilroy\\'s lead grew to three shots in shanghai."
    rows = [
        ("111", "BERTS2S", s, "extrinsic", "in shanghai", 41, 52, "wid_0"),
        ("111", "BERTS2S", s, "extrinsic", "in shanghai", 41, 52, "wid_1"),
        ("111", "BERTS2S", s, "intrinsic", "three shots", 28, 39, "wid_2"),  # one vote only
        ("111", "Gold", "a faithful gold summary.", "NULL", "NULL", -1, -1, "wid_0"),
        ("222", "Gold", "no article for this one.", "NULL", "NULL", -1, -1, "wid_0"),
    ]
    with open(xs / "hallucination_annotations_xsum_summaries.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["bbcid", "system", "summary", "hallucination_type", "hallucinated_span",
                    "hallucinated_span_start", "hallucinated_span_end", "worker_id"])
        w.writerows(rows)
    arts = root / "frank/data/articles-wbertscore-json"
    arts.mkdir(parents=True)
    (arts / "111.json").write_text(json.dumps({"article": "Rory McIlroy leads by three shots."}), encoding="utf-8")
    return root


def test_merge_spans_sorts_and_joins_overlaps():
    assert merge_spans([(5, 9), (0, 2), (8, 12), (12, 14), (3, 3)]) == [
        {"start": 0, "end": 2}, {"start": 5, "end": 14}]


def test_split_is_deterministic_and_respects_fraction():
    groups = [f"doc-{i}" for i in range(2000)]
    first = [split_of(g, 0.2) for g in groups]
    assert first == [split_of(g, 0.2) for g in groups]
    assert 0.15 < first.count("dev") / len(groups) < 0.25


def test_make_record_rejects_labels_outside_answer():
    with pytest.raises(ValueError, match="outside answer"):
        make_record("x", "ctx", None, "short", [(0, 10)], "qa", "t", "g")
    with pytest.raises(ValueError, match="context"):
        validate({"id": "x", "context": [1], "answer": "a", "labels": []})


def test_halueval_qa_pairs_faithful_and_whole_span(shared: Path):
    recs = list(convert.halueval_qa(shared))
    assert len(recs) == 6
    right, hal = recs[0], recs[1]
    assert right["labels"] == [] and right["answer"] == "Delhi"
    assert hal["labels"] == [{"start": 0, "end": len(hal["answer"])}]
    assert right["group"] == hal["group"]  # both answers of one question land in one split
    for r in recs:
        validate(r)


def test_faithbench_keeps_unwanted_spans_only_and_shifts_offsets(shared: Path):
    recs = list(convert.faithbench(shared))
    first, second = recs
    assert first["answer"].startswith("The film")  # leading space stripped
    assert [first["answer"][s["start"]:s["end"]] for s in first["labels"]] == ["production"]
    assert second["labels"] == []


def test_xsum_majority_vote_and_frank_join(shared: Path):
    recs = {r["id"]: r for r in convert.xsum(shared)}
    assert set(recs) == {"xsum-111-BERTS2S", "xsum-111-Gold"}  # 222 has no FRANK article
    r = recs["xsum-111-BERTS2S"]
    assert "'" in r["answer"] and "\\" not in r["answer"]
    assert [r["answer"][s["start"]:s["end"]] for s in r["labels"]] == ["in shanghai"]
    assert r["context"] == "Rory McIlroy leads by three shots."
    assert recs["xsum-111-Gold"]["labels"] == []


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([header, *rows])


def test_faithdial_reads_gold_and_model_files_and_labels_whole_replies(tmp_path: Path):
    audit = tmp_path / "faithdial_audit/data-audit"
    know = "Blue is one of the three primary colours of pigments in painting."
    _write_csv(audit / "gold/wow.csv", ["evidence", "history", "response", "BEGIN", "VRM"], [
        [know, "tell me about blue", "Blue is a primary colour in painting.", "Entailment", "Edification"],
        [know, "", "Blue was my grandmother's favourite colour.", "Partial Hallucination", "Disclosure"],
        [know, "", "unlabelled reply", "", ""],  # skipped: no BEGIN label
    ])
    _write_csv(audit / "GPT2/gpt2_processed_wow.csv", ["knowledge", "history", "gpt2", "begin_label", "vrm_label"], [
        [know, "", " Blue was invented in 1990 . ", "entailment,hallucination", "edification"],
        [know, "", "Do you like painting?", "generic", "question"],
    ])
    recs = list(convert.faithdial(tmp_path))
    by_answer = {r["answer"]: r for r in recs}
    assert set(by_answer) == {"Blue is a primary colour in painting.", "Blue was my grandmother's favourite colour.",
                              "Blue was invented in 1990 .", "Do you like painting?"}
    assert by_answer["Blue is a primary colour in painting."]["labels"] == []
    assert by_answer["Do you like painting?"]["labels"] == []  # generic counts as supported
    for text in ("Blue was my grandmother's favourite colour.", "Blue was invented in 1990 ."):
        assert by_answer[text]["labels"] == [{"start": 0, "end": len(text)}]
    assert by_answer["Blue is a primary colour in painting."]["question"] == "tell me about blue"
    assert by_answer["Do you like painting?"]["question"] is None and by_answer["Do you like painting?"]["context"] == know
    assert len({r["id"] for r in recs}) == 4
    for r in recs:
        validate(r)
    assert convert.DEV_FRACTION["faithdial"] == 1.0  # evaluation only: never in a training split
    assert {split_of(r["group"], convert.DEV_FRACTION["faithdial"]) for r in recs} == {"dev"}


def test_convert_cli_writes_both_splits(shared: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert convert.main(["--data", str(shared), "--out", str(out), "--sources", "halueval_qa", "faithbench",
                         "--dev-fraction", "0.5"]) == 0
    total = 0
    for src in ("halueval_qa", "faithbench"):
        parts = {s: list(read_jsonl(out / f"{src}.{s}.jsonl")) for s in ("train", "dev")}
        total += sum(len(v) for v in parts.values())
        assert not ({r["group"] for r in parts["train"]} & {r["group"] for r in parts["dev"]})
    assert total == 8


def test_convert_cli_reports_missing_data_folder(tmp_path: Path, capsys):
    assert convert.main(["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err


def test_synthetic_spans_are_exact(shared: Path):
    rows = QA_ROWS * 20
    recs = list(synthetic.build(rows, "train", seed=3, p_faithful=0.2, p_swap=0.4))
    kinds = {r["perturbation"] for r in recs}
    assert kinds == {"faithful", "swap", "addition"}
    for rec, row in zip(recs, rows):
        validate(rec)
        assert row["knowledge"] in rec["context"]
        if rec["perturbation"] == "faithful":
            assert rec["labels"] == []
            continue
        (span,) = rec["labels"]
        text = rec["answer"][span["start"]:span["end"]]
        assert text.strip() == text and text
        if rec["perturbation"] == "swap":
            assert text.lower() not in row["knowledge"].lower()  # a real change, not a copy


def test_synthetic_is_deterministic():
    a = [r["answer"] for r in synthetic.build(QA_ROWS * 5, "train", seed=7)]
    b = [r["answer"] for r in synthetic.build(QA_ROWS * 5, "train", seed=7)]
    assert a == b


def test_swap_changes_numbers_dates_and_months():
    import random

    knowledge = "The bridge opened in March 1932 and is 503 metres long."
    out = synthetic.swap(knowledge, 0, knowledge, ["Sydney Harbour"], random.Random(1))
    assert out is not None
    new, (s, e) = out
    assert new != knowledge and new[s:e] not in knowledge


def test_cross_swap_takes_a_fact_from_the_distractor_passage():
    """The error small RAG writers make (models/data/real_rag): a fact of the wrong passage. The new text is in
    the context, absent from the answer's own passage, and exactly what the label marks."""
    import random

    knowledge = "The bridge opened in March 1932 and is 503 metres long. It was designed by John Bradfield."
    others = "The tower opened in June 1889 and is 330 metres tall. It was designed by Gustave Eiffel."
    for seed in range(20):
        new, (s, e) = synthetic.cross_swap(knowledge, 0, knowledge, others, random.Random(seed))
        assert new[s:e] in others and new[s:e].lower() not in knowledge.lower()
        assert new != knowledge and new[:s] == knowledge[:s]  # one replacement, the text before it untouched
    assert synthetic.cross_swap(knowledge, 0, knowledge, "nothing to take here", random.Random(0)) is None


def test_synthetic_mixing_is_off_by_default_and_labels_distractor_facts():
    before = list(synthetic.build(QA_ROWS * 10, "train", seed=7))
    assert [r["answer"] for r in before] == [r["answer"] for r in synthetic.build(QA_ROWS * 10, "train", seed=7,
                                                                                   p_mix=0.0)]
    mixed = list(synthetic.build(QA_ROWS * 10, "train", seed=7, p_mix=1.0))
    faithful = [r["perturbation"] == "faithful" for r in before]
    assert [r["perturbation"] == "faithful" for r in mixed] == faithful  # only perturbed answers change kind
    assert any(r["perturbation"] == "mix" for r in mixed)
    for rec, old in zip(mixed, before):
        validate(rec)
        assert rec["context"] == old["context"]
        if rec["perturbation"] == "mix":
            (span,) = rec["labels"]
            text = rec["answer"][span["start"]:span["end"]]
            # in the context: only the passage it was taken from says it
            assert any(text in c for c in (rec["context"] if isinstance(rec["context"], list) else [rec["context"]]))


def test_summedits_keeps_exact_single_edits_and_rewordings(tmp_path: Path):
    doc = "Oman opened its airspace to Israeli carriers on Thursday, shortening flights to Asia by two hours."
    seed = "Oman opened its airspace to Israeli carriers, shortening flights to Asia."
    rows = [
        {"id": "news_1_og", "doc": doc, "summary": seed, "original_summary": seed, "label": "1", "edit_types": "[]"},
        {"id": "news_1_1", "doc": doc, "summary": "Oman opened its airspace to Israeli airlines, cutting flights to Asia.",
         "original_summary": seed, "label": "1", "edit_types": "[]"},  # reworded, still consistent
        {"id": "news_1_2", "doc": doc, "summary": "Oman closed its airspace to Israeli carriers, shortening flights to Asia.",
         "original_summary": seed, "label": "0", "edit_types": "['antonym_swap']"},
        {"id": "news_1_3", "doc": doc, "summary": "Oman opened its airspace to Israeli carriers on Monday, shortening flights.",
         "original_summary": seed, "label": "0", "edit_types": "['entity_modification']"},  # two edits: skipped
        {"id": "news_1_4", "doc": doc, "summary": "Oman opened its airspace to Israeli carriers, shortening flights.",
         "original_summary": seed, "label": "0", "edit_types": "[]"},  # a bare deletion: nothing to mark
    ]
    path = tmp_path / "summedits/data/summedits/summedits_news.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rows), encoding="utf-8")
    recs = list(convert.summedits(tmp_path))
    by_id = {r["id"]: r for r in recs}
    assert set(by_id) == {"summedits-news_1_og-seed", "summedits-news_1_1-edit", "summedits-news_1_2-edit"}
    assert by_id["summedits-news_1_og-seed"]["labels"] == [] and by_id["summedits-news_1_1-edit"]["labels"] == []
    edit = by_id["summedits-news_1_2-edit"]
    assert [edit["answer"][s["start"]:s["end"]] for s in edit["labels"]] == ["closed"]
    assert {r["group"] for r in recs} == {edit["group"]} and edit["context"] == doc and edit["question"] is None
    for r in recs:
        validate(r)


def test_edited_spans_marks_changed_words_and_reports_deletions():
    assert convert._edited_spans("It rose 5%, then fell.", "It rose 9%, then fell.") == [(8, 9)]
    assert convert._edited_spans("Sales rose in May.", "Sales rose sharply in May.") == [(11, 18)]
    assert convert._edited_spans("Sales did not rise.", "Sales did rise.") == [(-1, -1)]


def test_reword_keeps_claims_and_changes_surface():
    import random

    from models.pipelines.hallucination import reword

    text = "The film (released in 1999) was directed by Sofia Coppola. It began on June 5, 1990 with 3 actors."
    outs = [reword.reword(text, random.Random(i), max_rewrites=4) for i in range(40)]
    assert len(set(outs)) > 5 and sum(out != text for out in outs) > 30
    assert "Sofia Coppola directed the film." in reword._active("The film was directed by Sofia Coppola.", None)
    assert reword._dates("born June 5, 1990", None) == "born 5 June 1990"
    assert reword._dates("born 5 June 1990", None) == "born June 5, 1990"
    assert reword._numbers("with 3 actors and #1 hits", None) == "with three actors and #1 hits"
    assert reword._numbers("about 12,000 people", None) == "about 12000 people"
    assert reword._drop_parens("Iowa (also known as UI) is old.", None) == "Iowa is old."
    for out in outs:  # every fact-bearing name and number survives in some form
        assert "Coppola" in out and ("1990" in out)


def test_synthetic_rewording_is_off_by_default_and_keeps_spans_exact():
    plain = [r["answer"] for r in synthetic.build(QA_ROWS * 10, "train", seed=7)]
    assert plain == [r["answer"] for r in synthetic.build(QA_ROWS * 10, "train", seed=7, p_reword=0.0)]
    reworded = list(synthetic.build(QA_ROWS * 10, "train", seed=7, p_reword=1.0))
    assert any("October 11, 1957" in r["answer"] for r in reworded)
    for rec in reworded:
        validate(rec)
        for span in rec["labels"]:
            text = rec["answer"][span["start"]:span["end"]]
            assert text and text.strip() == text


def test_handwritten_probe_parses_into_pairs_with_one_marked_span():
    recs = list(convert.handwritten_rag(Path("unused")))
    assert len(recs) == 48 and len({r["group"] for r in recs}) == 24
    for faithful, twin in zip(recs[::2], recs[1::2]):
        validate(faithful)
        validate(twin)
        assert faithful["labels"] == [] and len(twin["labels"]) == 1
        assert faithful["context"] == twin["context"] and faithful["question"] == twin["question"]
        span = twin["labels"][0]
        assert "[[" not in twin["answer"] and twin["answer"][span["start"]:span["end"]].strip()
    assert convert.DEV_FRACTION["handwritten_rag"] == 1.0  # evaluation only


def test_unmark_keeps_edge_whitespace_outside_the_span():
    answer, spans = convert.unmark("Born in [[1962]], she wrote[[ three novels]].")
    assert answer == "Born in 1962, she wrote three novels."
    assert [answer[s:e] for s, e in spans] == ["1962", "three novels"]


LLM_RAG_TEXT = """# header lines are ignored
### 0
F: According to the passage, the Oberoi Group's head office is in Delhi.
H: According to the passage, the Oberoi Group's head office is in [[Mumbai]].
K: conflict
### 2
F: Dawn French was born on 11 October 1957.
H: Dawn French was born on 11 October 1957[[ in Holyhead, Wales]].
K: baseless
### 1
F: Arthur's Magazine came first.
H: Arthur's Magazine came [[first]].
K: overclaim
### 1
F: Arthur's Magazine came first.
H: Arthur's Magazine came [[first.
K: overclaim
### 1
F: Arthur's [[Magazine]] came first.
H: Arthur's Magazine came [[first]].
K: overclaim
### 1
F: Arthur's Magazine came first.
H: Arthur's Magazine came [[ ]] first.
K: overclaim
### 1
F: Arthur's Magazine came first.
H: Arthur's Magazine came [[first]].
K: guess
"""


def test_llm_rag_answers_join_the_halueval_passage_and_reject_malformed_blocks(shared: Path, tmp_path: Path):
    items, rejected = convert.parse_llm_rag(LLM_RAG_TEXT)
    assert [it["id"] for it in items] == ["0", "2"]
    assert [r.split(": ", 1)[1] for r in rejected] == [
        "H equals F", "no, unbalanced or empty marks in H", "marks in F",
        "no, unbalanced or empty marks in H", "missing id, F, H or K"]
    path = tmp_path / "answers.txt"
    path.write_text(LLM_RAG_TEXT, encoding="utf-8")
    recs = list(convert.llm_rag(shared, path=path))
    assert [r["id"] for r in recs] == ["llm_rag-0-faithful", "llm_rag-0-conflict",
                                      "llm_rag-2-faithful", "llm_rag-2-baseless"]
    for r in recs:
        validate(r)
    assert recs[0]["context"] == QA_ROWS[0]["knowledge"] and recs[0]["question"] == QA_ROWS[0]["question"]
    assert recs[0]["labels"] == [] and recs[0]["group"] == recs[1]["group"]
    twin = recs[3]
    assert [twin["answer"][s["start"]:s["end"]] for s in twin["labels"]] == ["in Holyhead, Wales"]
    # grouped like halueval_qa, so a question is dev in both sources or in neither
    qa = {r["question"]: r["group"] for r in convert.halueval_qa(shared)}
    assert recs[2]["group"] == qa[QA_ROWS[2]["question"]]


LLM_RAG_MULTI_TEXT = """### 2 @ 1 2 0
F: Dawn French, who starred in Girls on Top, was born on 11 October 1957.
H: Dawn French, who starred in Girls on Top, was born on 11 October 1957[[ in Holyhead]].
K: baseless
### 1 @
F: Arthur's Magazine came first.
H: Arthur's Magazine came [[second]].
K: conflict
### 1 @ 0 x
F: Arthur's Magazine came first.
H: Arthur's Magazine came [[second]].
K: conflict
"""


def test_llm_rag_multi_joins_the_listed_passages_in_order(shared: Path, tmp_path: Path, monkeypatch):
    items, rejected = convert.parse_llm_rag(LLM_RAG_MULTI_TEXT)
    assert [(it["id"], it["passages"]) for it in items] == [("2", "1 2 0")]
    assert rejected == ["'1 @': missing id, F, H or K", "'1 @ 0 x': missing id, F, H or K"]
    path = tmp_path / "multi.txt"
    path.write_text(LLM_RAG_MULTI_TEXT, encoding="utf-8")
    monkeypatch.setattr(convert, "LLM_RAG_MULTI", path)
    recs = list(convert.llm_rag_multi(shared))
    assert [r["id"] for r in recs] == ["llm_rag_multi-2-faithful", "llm_rag_multi-2-baseless"]
    for r in recs:
        validate(r)
        assert r["source"] == "llm_rag_multi" and r["question"] == QA_ROWS[2]["question"]
        assert r["context"] == [QA_ROWS[1]["knowledge"], QA_ROWS[2]["knowledge"], QA_ROWS[0]["knowledge"]]
    # the split follows the question, as in llm_rag and halueval_qa
    assert recs[0]["group"] == next(r["group"] for r in convert.halueval_qa(shared)
                                    if r["question"] == QA_ROWS[2]["question"])
    assert [recs[1]["answer"][s["start"]:s["end"]] for s in recs[1]["labels"]] == ["in Holyhead"]


@pytest.mark.parametrize("path, at_least, passages", [(convert.LLM_RAG, 2000, 0), (convert.LLM_RAG_MULTI, 750, 3)])
def test_committed_llm_rag_answers_are_well_formed(path: Path, at_least: int, passages: int):
    items, rejected = convert.parse_llm_rag(path.read_text(encoding="utf-8"))
    assert not rejected and len(items) >= at_least
    assert len({it["id"] for it in items}) == len(items)
    for it in items:  # the multi-passage file lists three passage rows, the question's own among them
        rows = it["passages"].split()
        assert len(rows) == passages and (not rows or it["id"] in rows)
    kinds = {k: sum(it["K"] == k for it in items) for k in ("baseless", "conflict", "overclaim")}
    assert min(kinds.values()) > 0.05 * len(items)


def _frank_fixture(root: Path) -> None:
    arts = root / "frank/data/articles-wbertscore-json"
    arts.mkdir(parents=True)
    (arts / "aaa.json").write_text(json.dumps({
        "article": "  Kilmarnock will confirm Gary Locke as manager on Friday. He signed a three-year deal.  ",
        "bart_lines": ["Gary Locke will be confirmed as Kilmarnock manager on Friday .",
                       "He signed a three-year deal ."],
        "s2s_lines": ["Gary Locke will be confirmed on Friday .", "He signed a five-year deal .", "Fans cheered ."],
    }), encoding="utf-8")
    (arts / "111.json").write_text(json.dumps({
        "article": "The biologist mapped the human genome.",
        "BERTS2S_lines": ["jk venter is one of the world\\'s most successful scientists."],
    }), encoding="utf-8")
    rows = [
        {"hash": "aaa", "model_name": "bart", "dataset": "cnndm", "Factuality": 1.0, "split": "test"},
        {"hash": "aaa", "model_name": "s2s", "dataset": "cnndm", "Factuality": 2 / 3, "split": "test"},
        {"hash": "111", "model_name": "BERTS2S", "dataset": "bbc", "Factuality": 0.0, "split": "valid"},
        {"hash": "zzz", "model_name": "bart", "dataset": "cnndm", "Factuality": 0.0, "split": "test"},  # no article
    ]
    (root / "frank/data/human_annotations.json").write_text(json.dumps(rows), encoding="utf-8")


def test_frank_marks_not_fully_factual_summaries_whole_and_groups_by_article(tmp_path: Path, capsys):
    _frank_fixture(tmp_path)
    recs = {r["id"]: r for r in convert.frank(tmp_path)}
    assert set(recs) == {"frank-cnndm-aaa-bart", "frank-cnndm-aaa-s2s", "frank-bbc-111-BERTS2S"}
    assert "1 annotated summaries without article" in capsys.readouterr().err
    bart, s2s, bbc = recs["frank-cnndm-aaa-bart"], recs["frank-cnndm-aaa-s2s"], recs["frank-bbc-111-BERTS2S"]
    assert bart["answer"] == ("Gary Locke will be confirmed as Kilmarnock manager on Friday ."
                              " He signed a three-year deal .")
    assert bart["labels"] == []  # Factuality 1.0: every sentence judged factual
    assert s2s["labels"] == [{"start": 0, "end": len(s2s["answer"])}]  # 2 of 3 sentences factual: still flagged
    assert bbc["answer"] == "jk venter is one of the world's most successful scientists."
    assert bbc["labels"] == [{"start": 0, "end": len(bbc["answer"])}]
    assert bart["context"].startswith("Kilmarnock") and bart["question"] is None
    assert bart["group"] == s2s["group"] != bbc["group"]  # all summaries of one article share a split
    for r in recs.values():
        validate(r)
        assert r["source"] == "frank" and r["task"] == "summarization"
    assert [r["id"] for r in convert.frank(tmp_path, limit=1)] == ["frank-cnndm-aaa-bart"]


def _qags_fixture(root: Path) -> None:
    def sent(text: str, *votes: str) -> dict:
        return {"sentence": text, "responses": [{"worker_id": k, "response": v} for k, v in enumerate(votes)]}

    _write_jsonl(root / "qags/data/mturk_cnndm.jsonl", [
        {"article": "Sarah Flower says a diet of fresh food gives all the nutrients you need.",
         "summary_sentences": [sent("Sarah Flower is a nutritionist.", "yes", "yes", "no"),
                               sent("She sells vitamin pills.", "no", "yes", "no"),
                               sent("Fresh food gives all nutrients.", "yes", "yes", "yes"),
                               sent("She lives in Paris.", "no", "no", "no")]},
    ])
    _write_jsonl(root / "qags/data/mturk_xsum.jsonl", [
        {"article": "A G4S van was robbed in Glasgow.",
         "summary_sentences": [sent("A security van was robbed in Edinburgh.", "yes", "yes", "no")]},
        {"article": "Police closed the M8 after a crash.",
         "summary_sentences": [sent("The M8 was closed after a fatal crash.", "no", "yes", "no")]},
    ])


def test_qags_spans_are_exactly_the_majority_unfaithful_sentences(tmp_path: Path):
    _qags_fixture(tmp_path)
    recs = {r["id"]: r for r in convert.qags(tmp_path)}
    assert set(recs) == {"qags-cnndm-0", "qags-xsum-0", "qags-xsum-1"}
    cnn = recs["qags-cnndm-0"]
    assert cnn["answer"] == ("Sarah Flower is a nutritionist. She sells vitamin pills. Fresh food gives all nutrients. "
                             "She lives in Paris.")
    assert [cnn["answer"][s["start"]:s["end"]] for s in cnn["labels"]] == ["She sells vitamin pills.",
                                                                          "She lives in Paris."]
    assert recs["qags-xsum-0"]["labels"] == []  # one "no" of three is a minority
    one = recs["qags-xsum-1"]
    assert one["labels"] == [{"start": 0, "end": len(one["answer"])}]
    assert cnn["group"] == digest(cnn["context"]) and len({r["group"] for r in recs.values()}) == 3
    for r in recs.values():
        validate(r)
        assert r["source"] == "qags" and r["question"] is None


QUESTION = "How does magma form?"


def _eval_sets_fixture(root: Path) -> None:
    answer = "Magma forms when rock melts. It rises because it is lighter than the rock around it."
    _write_jsonl(root / "expertqa/expertqa.jsonl", [
        {"id": "expertqa/answer/rr_gs_gpt4/abc/0", "context": ["[1] https://a.example\n\nRock melts into magma."],
         "question": QUESTION + " ", "answer": answer, "labels": [{"start": 29, "end": len(answer)}],
         "task": "rag_qa", "label_granularity": "claim"},
        {"id": "expertqa/claim/post_hoc_gs_gpt4/def/1", "context": ["[2] https://b.example\n\nSomething else."],
         "question": "Can autism be cured?", "answer": "Autism can be cured with diet.",
         "labels": [{"start": 0, "end": 30}], "task": "posthoc_attributed_qa", "label_granularity": "claim"},
    ])
    _write_jsonl(root / "attributionbench_subset/attributionbench_subset.jsonl", [
        {"id": "attributionbench/ExpertQA/ExpertQA_1", "context": ["[1] https://a.example\n\nRock melts into magma."],
         "question": QUESTION, "answer": "Magma forms when rock melts [1].", "labels": [],
         "task": "rag_qa", "label_granularity": "claim"},
        {"id": "attributionbench/HAGRID/HAGRID_7",
         "context": ["Finland has 5.5 million people.", "Helsinki is its capital."],
         "question": "What is the population of Finland?", "answer": "Finland has 6 million people [1].",
         "labels": [{"start": 0, "end": 33}], "task": "rag_qa", "label_granularity": "claim"},
    ])


def test_expertqa_and_attributionbench_pass_rows_through_and_share_question_groups(tmp_path: Path):
    _eval_sets_fixture(tmp_path)
    eqa = list(convert.expertqa(tmp_path))
    ab = list(convert.attributionbench(tmp_path))
    assert [r["task"] for r in eqa] == ["rag_qa", "posthoc_attributed_qa"]
    assert [r["task"] for r in ab] == ["rag_qa/ExpertQA", "rag_qa/HAGRID"]  # sub-dataset reported apart
    assert [r["id"] for r in ab] == ["attributionbench/ExpertQA/ExpertQA_1", "attributionbench/HAGRID/HAGRID_7"]
    first = eqa[0]
    assert first["answer"][first["labels"][0]["start"]:] == "It rises because it is lighter than the rock around it."
    assert first["context"] == ["[1] https://a.example\n\nRock melts into magma."] and first["source"] == "expertqa"
    assert ab[1]["context"] == ["Finland has 5.5 million people.", "Helsinki is its capital."]
    assert ab[0]["labels"] == [] and ab[1]["labels"] == [{"start": 0, "end": 33}]
    assert ab[1]["source"] == "attributionbench"
    # the same question (even with a trailing space in one copy) gets one split key in both sets
    assert first["group"] == ab[0]["group"] == digest(QUESTION)
    assert len({eqa[1]["group"], ab[1]["group"], first["group"]}) == 3
    for r in eqa + ab:
        validate(r)


def test_human_judged_real_output_sets_go_to_dev_only(tmp_path: Path):
    _frank_fixture(tmp_path)
    _qags_fixture(tmp_path)
    _eval_sets_fixture(tmp_path)
    out = tmp_path / "out"
    assert convert.main(["--data", str(tmp_path), "--out", str(out), "--sources", "frank", "qags", "expertqa",
                         "attributionbench"]) == 0
    for src, n in (("frank", 3), ("qags", 3), ("expertqa", 2), ("attributionbench", 2)):
        assert convert.DEV_FRACTION[src] == 1.0
        assert list(read_jsonl(out / f"{src}.train.jsonl")) == []
        assert len(list(read_jsonl(out / f"{src}.dev.jsonl"))) == n
