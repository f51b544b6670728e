"""Explainer data: label mapping, held-out splits without shared premises, duplicate handling,
on small files written in the shared data's formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.pipelines.explainer import data as explainer_data


@pytest.fixture()
def nli_dir(tmp_path: Path) -> Path:
    tax = tmp_path / "taxinli"
    tax.mkdir()
    rows = ["prem\thyp\tlabel\tgenre"]
    for i in range(200):
        for j, lab in enumerate(("entailment", "neutral", "contradiction")):
            rows.append(f"premise number {i}\thypothesis {i}-{j}\t{lab}\tfiction")
    (tax / "taxinli10k.tsv").write_text("\n".join(rows) + "\n")
    (tax / "taxinli10k_MNLIDev.tsv").write_text("this file must not be read\n")
    fev = tmp_path / "fever_symmetric"
    fev.mkdir()
    for name, lab in (("fever_symmetric_dev.jsonl", "SUPPORTS"), ("fever_symmetric_test.jsonl", "REFUTES")):
        (fev / name).write_text(json.dumps({"claim": "c", "evidence": "e " + name, "gold_label": lab}) + "\n")
    sick = tmp_path / "sick2014"
    sick.mkdir()
    head = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    (sick / "SICK_train.txt").write_text(head + "1\tA dog runs\tA dog moves\t4\tENTAILMENT\n2\tA b\tA b\t5\tNEUTRAL\n")
    (sick / "SICK_trial.txt").write_text(head)
    (sick / "SICK_test_annotated.txt").write_text(head + "3\tA b\tA b\t5\tNEUTRAL\n")
    return tmp_path


def test_mnli_split_by_premise_never_shares_a_premise(nli_dir):
    s = explainer_data.load_source("mnli", nli_dir)
    train_p = {p for p, _, _ in s["train"]}
    test_p = {p for p, _, _ in s["test"]}
    assert train_p.isdisjoint(test_p)
    assert len(s["train"]) + len(s["test"]) == 600
    assert 0.05 < len(s["test"]) / 600 < 0.3


def test_fever_maps_two_way_labels(nli_dir):
    s = explainer_data.load_source("fever_symmetric", nli_dir)
    assert s["train"][0] == ("e fever_symmetric_dev.jsonl", "c", "entailment")
    assert s["test"][0][2] == "contradiction"


def test_sick_upper_case_labels_and_test_duplicates_removed_from_train(nli_dir):
    s = explainer_data.load_source("sick", nli_dir)
    assert s["train"] == [("A dog runs", "A dog moves", "entailment")]
    assert s["test"] == [("A b", "A b", "neutral")]


def test_unknown_source_is_named(nli_dir):
    with pytest.raises(KeyError, match="wanli"):
        explainer_data.load_source("wanli", nli_dir)
