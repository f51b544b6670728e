"""The runner pools metrics overall and per task from any `Example -> Prediction` callable."""

from __future__ import annotations

import json

import pytest

from extproc.evaluation.dataset import parse_jsonl
from extproc.evaluation.progress import Progress
from extproc.evaluation.report import format_table
from extproc.evaluation.runner import PredictedSpan, Prediction, evaluate, prediction_record

DATA = "\n".join(
    json.dumps(r)
    for r in [
        # answer "Paris is in Spain." gold span "Spain" = [12, 17)
        {"id": "1", "context": "c", "question": "q", "answer": "Paris is in Spain.", "labels": [{"start": 12, "end": 17}], "task": "qa"},
        {"id": "2", "context": "c", "question": "q", "answer": "Paris is in France.", "labels": [], "task": "qa"},
        {"id": "3", "context": ["c"], "question": None, "answer": "Short summary.", "labels": [], "task": "summ"},
    ]
)


def _words(answer: str) -> tuple[tuple[int, int], ...]:
    out, pos = [], 0
    for w in answer.split(" "):
        out.append((pos, pos + len(w)))
        pos += len(w) + 1
    return tuple(out)


def scorer(ex):  # a deterministic stand-in for the detector: flags the word "Spain"/"France"
    offsets = _words(ex.answer)
    probs = tuple(0.9 if ex.answer[s:e].rstrip(".") in {"Spain", "France"} else 0.1 for s, e in offsets)
    spans = tuple(
        PredictedSpan(s, e, ex.answer[s:e], p) for (s, e), p in zip(offsets, probs) if p >= 0.5
    )
    return Prediction(spans=spans, score=max(probs), token_offsets=offsets, token_probs=probs, windows=1, latency_ms=float(ex.line))


def test_overall_and_per_task_metrics() -> None:
    examples = parse_jsonl(DATA)
    report = evaluate(examples, scorer, token_threshold=0.5)
    assert report["examples"] == 3 and report["hallucinated_examples"] == 1
    ex = report["example_level"]
    assert (ex["tp"], ex["fp"], ex["fn"], ex["tn"]) == (1, 1, 0, 1)
    assert ex["precision"] == 0.5 and ex["recall"] == 1.0
    ch = report["span_level_char"]
    # predicted "Spain." [12,18) and "France." [12,19): overlap 5 with gold [12,17)
    assert (ch["overlap_chars"], ch["predicted_chars"], ch["gold_chars"]) == (5, 13, 5)
    tok = report["token_level"]
    assert (tok["tp"], tok["fp"], tok["fn"]) == (1, 1, 0)
    # response scores 0.9, 0.9, 0.1 with gold 1, 0, 0: positive ties one negative, beats the other
    assert report["auroc"] == pytest.approx(0.75)
    assert report["latency_ms"]["p50"] == 2.0
    assert set(report["by_task"]) == {"qa", "summ"}
    assert report["by_task"]["summ"]["auroc"] is None  # one class only
    assert report["by_task"]["qa"]["examples"] == 2
    assert "token_level" in report["definitions"]
    json.dumps(report)  # the report must be serialisable as-is
    table = format_table(report)
    assert table.splitlines()[2].startswith("ALL") and "summ" in table


def test_span_outside_answer_is_an_error() -> None:
    (ex,) = parse_jsonl(json.dumps({"id": "1", "context": "c", "question": None, "answer": "abc", "labels": []}))
    bad = Prediction(spans=(PredictedSpan(1, 9, "bc", 0.9),), score=0.9, token_offsets=(), token_probs=())
    with pytest.raises(ValueError, match="outside answer"):
        evaluate([ex], lambda _: bad, token_threshold=0.5)


def test_prediction_record_roundtrips_labels_and_spans() -> None:
    ex = parse_jsonl(DATA)[0]
    rec = prediction_record(ex, scorer(ex))
    assert rec["labels"] == [{"start": 12, "end": 17}]
    assert rec["spans"][0]["text"] == "Spain." and rec["max_token_prob"] == 0.9


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty, self.parts = tty, []

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.parts.append(s)

    def flush(self) -> None:
        pass


def test_progress_auto_is_off_without_tty_and_draws_on_tty() -> None:
    assert Progress.auto("auto", _Stream(False)) is False
    assert Progress.auto("auto", _Stream(True)) is True
    assert Progress.auto("off", _Stream(True)) is False
    stream = _Stream(True)
    p = Progress(total=3, enabled=True, stream=stream)
    evaluate(parse_jsonl(DATA), scorer, token_threshold=0.5, progress=p)
    assert "3/3" in "".join(stream.parts)
    silent = _Stream(False)
    q = Progress(total=3, enabled=False, stream=silent)
    evaluate(parse_jsonl(DATA), scorer, token_threshold=0.5, progress=q)
    assert silent.parts == []
