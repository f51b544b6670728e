"""Sentinel data: loader quirks and the by-source split, on small files written in the
shared data's formats (the real data is not needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.pipelines.sentinel import data as sentinel_data
from models.pipelines.sentinel.data import build_splits


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    (tmp_path / "freebaseqa").mkdir()
    (tmp_path / "freebaseqa" / "FreebaseQA-dev.txt").write_text(
        "Which river flows through Paris? | seine \n85326 | whose film debut was jennings in revenge \n")
    (tmp_path / "freebaseqa" / "FreebaseQA-eval.txt").write_text("Who painted the Mona Lisa? | da vinci \n")
    (tmp_path / "self_instruct").mkdir()
    (tmp_path / "self_instruct" / "sciq_Direct_Question_Closed_Book_.jsonl").write_text(
        json.dumps({"prompt": "Q: What gas do plants absorb?\n\n\nA:\n", "completion": "co2"}) + "\n")
    (tmp_path / "self_instruct" / "kilt_tasks_hotpotqa_straighforward_qa.jsonl").write_text(
        json.dumps({"prompt": "Which magazine started first?\n", "completion": "x"}) + "\n")
    (tmp_path / "gsm8k").mkdir()
    for name, q in (("train.jsonl", "Tom has 3 apples. How many?"), ("test.jsonl", "Tom has 3 apples. How many?")):
        (tmp_path / "gsm8k" / name).write_text(json.dumps({"question": q, "answer": "#### 3"}) + "\n")
    sub = tmp_path / "subjqa" / "restaurants"
    sub.mkdir(parents=True)
    (sub / "dev.csv").write_text("question,question_subj_level\nHow is the service?,1\nWhat time do they open?,5\n")
    (tmp_path / "subjqa" / "tripadvisor").mkdir()
    return tmp_path


def test_freebaseqa_takes_the_question_side_even_when_swapped(data_dir):
    got = sentinel_data.load_source("freebaseqa", data_dir)
    assert got == ["Which river flows through Paris?", "whose film debut was jennings in revenge",
                   "Who painted the Mona Lisa?"]


def test_sciq_wrapper_is_stripped(data_dir):
    assert sentinel_data.load_source("hotpotqa_sciq", data_dir) == [
        "Which magazine started first?", "What gas do plants absorb?"]


def test_duplicates_are_dropped_within_a_source(data_dir):
    assert sentinel_data.load_source("gsm8k", data_dir) == ["Tom has 3 apples. How many?"]


def test_subjqa_keeps_only_subjective_levels(data_dir):
    assert sentinel_data.load_source("subjqa_b", data_dir) == ["How is the service?"]


def test_unknown_source_is_named(data_dir):
    with pytest.raises(KeyError, match="nope"):
        sentinel_data.load_source("nope", data_dir)


def test_build_splits_keeps_sources_whole_and_labels_from_config(data_dir):
    cfg = {"seed": 1, "data": {"train": {"factual": ["freebaseqa"], "non_factual": ["gsm8k"]},
                               "dev": {"factual": ["hotpotqa_sciq"], "non_factual": ["subjqa_b"]}}}
    s = build_splits(cfg, data_dir)
    assert {src for *_, src in s["train"]} == {"freebaseqa", "gsm8k"}
    assert {src for *_, src in s["dev"]} == {"hotpotqa_sciq", "subjqa_b"}
    assert all(y == (1 if src in ("freebaseqa", "hotpotqa_sciq") else 0) for _, y, src in s["train"] + s["dev"])


def test_build_splits_drops_dev_prompts_seen_in_training(data_dir):
    cfg = {"seed": 1, "data": {"train": {"non_factual": ["gsm8k"]}, "dev": {"factual": ["gsm8k"]}}}
    assert build_splits(cfg, data_dir)["dev"] == []
