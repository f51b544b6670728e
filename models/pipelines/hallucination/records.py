"""The evaluation/training record format shared by every converter, plus the dev/train split.

A record is one answer to judge against its grounding:
  {"id", "context": str | [str], "question": str | None, "answer": str,
   "labels": [{"start", "end"}], "task", "source", "group"}
`labels` are character offsets into `answer` (empty list = faithful). `group` is what the
split hashes (a document or question id), so every answer about one document lands on the
same side and dev never shares a source text with train.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

Record = dict[str, Any]

SPLITS = ("train", "dev")


def digest(text: str) -> str:
    """The `group` id of a text (a document, a question): 12 hex digits of its SHA-1."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def split_of(group: str, dev_fraction: float, salt: str = "truthlens") -> str:
    """Deterministic split by hashing the group id (stable across machines and Python runs)."""
    h = int(hashlib.sha1(f"{salt}:{group}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "dev" if h < dev_fraction else "train"


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[dict[str, int]]:
    """Sort and merge overlapping/adjacent spans into the record's label list."""
    out: list[list[int]] = []
    for s, e in sorted((int(s), int(e)) for s, e in spans if e > s):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [{"start": s, "end": e} for s, e in out]


def make_record(
    rid: str,
    context: str | Sequence[str],
    question: str | None,
    answer: str,
    spans: Iterable[tuple[int, int]],
    task: str,
    source: str,
    group: str,
) -> Record:
    labels = merge_spans(spans)
    for lab in labels:
        if not 0 <= lab["start"] < lab["end"] <= len(answer):
            raise ValueError(f"{rid}: label {lab} outside answer of length {len(answer)}")
    ctx: str | list[str] = context if isinstance(context, str) else list(context)
    return {
        "id": rid, "context": ctx, "question": question, "answer": answer,
        "labels": labels, "task": task, "source": source, "group": group,
    }


def validate(rec: Record) -> None:
    """Raise ValueError naming the record if it breaks the format."""
    rid = rec.get("id", "?")
    for key in ("id", "context", "answer", "labels"):
        if key not in rec:
            raise ValueError(f"{rid}: missing {key!r}")
    ctx = rec["context"]
    if not (isinstance(ctx, str) or (isinstance(ctx, list) and all(isinstance(c, str) for c in ctx))):
        raise ValueError(f"{rid}: context must be a string or a list of strings")
    if rec.get("question") is not None and not isinstance(rec["question"], str):
        raise ValueError(f"{rid}: question must be a string or null")
    n = len(rec["answer"])
    for lab in rec["labels"]:
        if not 0 <= lab["start"] < lab["end"] <= n:
            raise ValueError(f"{rid}: label {lab} outside answer of length {n}")


def write_jsonl(path: str | Path, records: Iterable[Record]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Record]:
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{i}: {exc}") from exc


def is_hallucinated(rec: Record) -> bool:
    return bool(rec["labels"])
