"""Load and validate evaluation JSONL.

One record per line:
`{"id", "context": str | [str], "question": str | null, "answer": str,
  "labels": [{"start", "end"}], "task"?}` where labels are half-open character
offsets into `answer` and an empty list means the answer is faithful.

The loader checks the whole file and reports every bad line at once, each as
`FILE:LINE: field: expected ..., got ...`, so a 10k-line file is fixed in one pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_REPORTED_ERRORS = 50


class DatasetError(Exception):
    """Every problem found in one dataset file, one line each."""

    def __init__(self, errors: list[str], source: str) -> None:
        self.errors = tuple(errors)
        self.source = source
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True, slots=True)
class Example:
    id: str
    context: tuple[str, ...]
    question: str | None
    answer: str
    labels: tuple[tuple[int, int], ...]
    task: str | None = None
    line: int = 0

    @property
    def hallucinated(self) -> bool:
        return bool(self.labels)


def load_jsonl(path: str | Path) -> list[Example]:
    """Parse and validate; raises DatasetError listing every bad line (first 50)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([f"{source}: cannot read: {exc}"], source) from exc
    return parse_jsonl(text, source)


def parse_jsonl(text: str, source: str = "<jsonl>") -> list[Example]:
    examples: list[Example] = []
    errors: list[str] = []
    first_line_of: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        line_errors: list[str] = []
        example = _parse_line(raw, lineno, line_errors)
        if example is not None and example.id in first_line_of:
            line_errors.append(f"id: duplicate {example.id!r} (first seen on line {first_line_of[example.id]})")
        errors.extend(f"{source}:{lineno}: {e}" for e in line_errors)
        if example is not None and not line_errors:
            first_line_of[example.id] = lineno
            examples.append(example)
    if not examples and not errors:
        errors.append(f"{source}: no records (empty file)")
    if errors:
        shown = errors[:MAX_REPORTED_ERRORS]
        if len(errors) > MAX_REPORTED_ERRORS:
            shown.append(f"{source}: ... and {len(errors) - MAX_REPORTED_ERRORS} more errors")
        raise DatasetError(shown, source)
    return examples


def _parse_line(raw: str, lineno: int, errors: list[str]) -> Example | None:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        errors.append(f"invalid JSON: {exc.msg} at column {exc.colno}")
        return None
    if not isinstance(record, dict):
        errors.append(f"expected a JSON object, got {_kind(record)}")
        return None

    rid = record.get("id")
    if "id" not in record:
        errors.append("id: missing")
    elif isinstance(rid, bool) or not isinstance(rid, (str, int)) or (isinstance(rid, str) and not rid.strip()):
        errors.append(f"id: expected a non-empty string or integer, got {_show(rid)}")

    context = _context(record, errors)

    question = record.get("question")
    if question is not None and not isinstance(question, str):
        errors.append(f"question: expected a string or null, got {_show(question)}")

    answer = record.get("answer")
    if "answer" not in record:
        errors.append("answer: missing")
    elif not isinstance(answer, str):
        errors.append(f"answer: expected a string, got {_show(answer)}")

    labels = _labels(record, answer if isinstance(answer, str) else None, errors)

    task = record.get("task")
    if task is not None and not isinstance(task, str):
        errors.append(f"task: expected a string or null, got {_show(task)}")

    if errors:
        return None
    return Example(
        id=str(rid),
        context=context,
        question=question,
        answer=answer,
        labels=labels,
        task=task,
        line=lineno,
    )


def _context(record: dict[str, Any], errors: list[str]) -> tuple[str, ...]:
    if "context" not in record:
        errors.append("context: missing")
        return ()
    value = record["context"]
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        bad = [i for i, v in enumerate(value) if not isinstance(v, str)]
        if bad:
            errors.append(f"context[{bad[0]}]: expected a string, got {_show(value[bad[0]])}")
            return ()
        return tuple(value)
    errors.append(f"context: expected a string or a list of strings, got {_show(value)}")
    return ()


def _labels(record: dict[str, Any], answer: str | None, errors: list[str]) -> tuple[tuple[int, int], ...]:
    if "labels" not in record:
        errors.append("labels: missing (use [] for a faithful answer)")
        return ()
    value = record["labels"]
    if not isinstance(value, list):
        errors.append(f"labels: expected a list of {{start, end}} objects, got {_show(value)}")
        return ()
    out: list[tuple[int, int]] = []
    for i, item in enumerate(value):
        where = f"labels[{i}]"
        if not isinstance(item, dict):
            errors.append(f"{where}: expected an object with start and end, got {_show(item)}")
            continue
        start, end = item.get("start"), item.get("end")
        ok = True
        for key, v in (("start", start), ("end", end)):
            if isinstance(v, bool) or not isinstance(v, int):
                errors.append(f"{where}.{key}: expected an integer character offset, got {_show(v)}")
                ok = False
        if not ok:
            continue
        if not 0 <= start < end:
            errors.append(f"{where}: expected 0 <= start < end, got start={start} end={end}")
        elif answer is not None and end > len(answer):
            errors.append(f"{where}.end: expected <= len(answer) = {len(answer)}, got {end}")
        else:
            out.append((start, end))
    return tuple(out)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
