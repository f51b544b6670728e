"""JSONL loading: valid records normalise, bad ones are reported with line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.evaluation.dataset import DatasetError, load_jsonl, parse_jsonl


def _line(**record: object) -> str:
    base: dict[str, object] = {"id": "a", "context": "ctx", "question": "q?", "answer": "The answer.", "labels": []}
    base.update(record)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_valid_records_normalise(tmp_path: Path) -> None:
    text = "\n".join(
        [
            _line(id="a", context="one doc", task="qa"),
            "",  # blank lines are allowed
            _line(id=7, context=["d1", "d2"], question=None, labels=[{"start": 4, "end": 10}]),
        ]
    )
    path = tmp_path / "d.jsonl"
    path.write_text(text + "\n", encoding="utf-8")
    a, b = load_jsonl(path)
    assert a.context == ("one doc",) and a.task == "qa" and not a.hallucinated and a.line == 1
    assert b.id == "7" and b.context == ("d1", "d2") and b.question is None
    assert b.labels == ((4, 10),) and b.hallucinated and b.line == 3


def _errors(text: str) -> list[str]:
    with pytest.raises(DatasetError) as info:
        parse_jsonl(text, "data.jsonl")
    return list(info.value.errors)


def test_every_bad_line_is_reported_with_line_number_and_field() -> None:
    text = "\n".join(
        [
            _line(id="ok"),
            "{not json",
            _line(id="x", answer=5),
            _line(id="y", labels=[{"start": 3, "end": 99}]),
            _line(id="z", context=["a", 3]),
            _line(id="w", labels=[{"start": 5, "end": 5}, {"start": "0", "end": 2}]),
            _line(id="v", answer=...),
            "[1, 2]",
        ]
    )
    errors = _errors(text)
    assert errors[0].startswith("data.jsonl:2: invalid JSON")
    assert "data.jsonl:3: answer: expected a string, got 5" in errors
    assert "data.jsonl:4: labels[0].end: expected <= len(answer) = 11, got 99" in errors
    assert "data.jsonl:5: context[1]: expected a string, got 3" in errors
    assert "data.jsonl:6: labels[0]: expected 0 <= start < end, got start=5 end=5" in errors
    assert 'data.jsonl:6: labels[1].start: expected an integer character offset, got "0"' in errors
    assert "data.jsonl:7: answer: missing" in errors
    assert "data.jsonl:8: expected a JSON object, got a list" in errors
    assert not any(e.startswith("data.jsonl:1:") for e in errors)


def test_missing_labels_and_context_and_bad_types() -> None:
    errors = _errors(_line(labels=..., context=..., question=3, task=1, id=""))
    assert "data.jsonl:1: labels: missing (use [] for a faithful answer)" in errors
    assert "data.jsonl:1: context: missing" in errors
    assert "data.jsonl:1: question: expected a string or null, got 3" in errors
    assert "data.jsonl:1: task: expected a string or null, got 1" in errors
    assert any(e.startswith("data.jsonl:1: id: expected a non-empty string") for e in errors)


def test_duplicate_ids_are_rejected() -> None:
    errors = _errors(_line(id="a") + "\n" + _line(id="a"))
    assert errors == ["data.jsonl:2: id: duplicate 'a' (first seen on line 1)"]


def test_empty_file_and_unreadable_file(tmp_path: Path) -> None:
    assert _errors("\n\n") == ["data.jsonl: no records (empty file)"]
    with pytest.raises(DatasetError) as info:
        load_jsonl(tmp_path / "missing.jsonl")
    assert "cannot read" in str(info.value)


def test_error_list_is_capped() -> None:
    errors = _errors("\n".join("{" for _ in range(60)))
    assert len(errors) == 51 and errors[-1] == "data.jsonl: ... and 10 more errors"
