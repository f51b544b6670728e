"""`truthlens eval` and `truthlens detect` as users run them: subprocesses over tiny exported models.

The models have random weights, so these tests check structure and internal
consistency (counts add up, spans lie inside the answer, the AUROC recomputes
from the per-example predictions), never quality.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extproc.config import default_config
from extproc.evaluation.metrics import auroc

WORDS = "the tower in paris was built in 1889 and the river water boils at 100 degrees".split()
RECORDS = [
    {"id": "q1", "context": "the eiffel tower in paris was built in 1889 .", "question": "when was the tower built ?",
     "answer": "the tower was built in 1925 in paris .", "labels": [{"start": 23, "end": 27}], "task": "qa"},
    {"id": "s1", "context": ["paris is the capital of france .", "the river in paris ."], "question": None,
     "answer": "paris is the capital city of france .", "labels": [], "task": "summarization"},
    {"id": "q2", "context": "water boils at 100 degrees celsius at sea level .", "question": "what does water do ?",
     "answer": "water boils at 90 degrees celsius .", "labels": [{"start": 15, "end": 17}, {"start": 18, "end": 25}],
     "task": "qa"},
    # long context: the tiny models have max_length 128, so this must be windowed
    {"id": "long", "context": " ".join(WORDS * 30), "question": "what boils ?", "answer": "water boils at 100 degrees .",
     "labels": []},
]


def _cli(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extproc.cli", *args], input=stdin, capture_output=True, text=True, timeout=240,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def models(tiny_models) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"detector": str(tiny_models["bert-token"]), "explainer": str(tiny_models["bert-nli"])}


def _write_data(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n", encoding="utf-8")
    return path


def test_eval_writes_consistent_report_and_predictions(tmp_path: Path, models: dict[str, str]) -> None:
    data = _write_data(tmp_path)
    out, preds = tmp_path / "out" / "metrics.json", tmp_path / "out" / "preds.jsonl"
    proc = _cli("eval", "--data", str(data), "--out", str(out), "--model-dir", models["detector"],
                "--explainer-dir", models["explainer"], "--predictions", str(preds))
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "ex/s" not in proc.stderr  # no progress bar without a TTY
    assert proc.stdout.splitlines()[2].startswith("ALL")

    report = json.loads(out.read_text())
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    n = len(RECORDS)
    assert report["examples"] == n and len(lines) == n
    assert report["hallucinated_examples"] == 2
    assert set(report["by_task"]) == {"qa", "summarization", "(none)"}
    assert report["settings"]["explainer"] == "on" and report["settings"]["thresholds"]["token"] == default_config().truthlens.thresholds.token

    ex = report["example_level"]
    assert ex["tp"] + ex["fp"] + ex["fn"] + ex["tn"] == n
    assert ex["tp"] + ex["fp"] == sum(1 for p in lines if p["spans"])
    chars = report["span_level_char"]
    assert chars["gold_chars"] == 4 + 2 + 7
    assert chars["predicted_chars"] == sum(s["end"] - s["start"] for p in lines for s in p["spans"])
    tok = report["token_level"]
    assert tok["tp"] + tok["fn"] >= 3  # every gold span covers at least one answer token
    assert tok["tp"] + tok["fp"] + tok["fn"] + tok["tn"] > n

    answers = {r["id"]: r["answer"] for r in RECORDS}
    for p in lines:
        for s in p["spans"]:
            assert s["text"] == answers[p["id"]][s["start"] : s["end"]]
            assert s["nli_label"] in {"entailment", "neutral", "contradiction"}
        assert 0.0 <= p["max_token_prob"] <= 1.0
    by_id = {p["id"]: p for p in lines}
    assert by_id["long"]["windows"] > 1 and report["windows"]["max"] == by_id["long"]["windows"]
    expected_auroc = auroc([p["max_token_prob"] for p in lines], [bool(r["labels"]) for r in RECORDS])
    assert report["auroc"] == pytest.approx(expected_auroc)
    assert report["latency_ms"]["count"] == n and report["latency_ms"]["p50"] > 0
    assert report["by_task"]["summarization"]["auroc"] is None


def test_eval_rejects_bad_data_before_loading_models(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({**RECORDS[1], "labels": [{"start": 3}]}) + "\n")
    proc = _cli("eval", "--data", str(data), "--out", str(tmp_path / "m.json"), "--model-dir", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert f"{data}:2: labels[0].end: expected an integer character offset, got null" in proc.stderr
    assert not (tmp_path / "m.json").exists()


def test_eval_missing_detector_is_a_clear_error(tmp_path: Path) -> None:
    proc = _cli("eval", "--data", str(_write_data(tmp_path)), "--out", str(tmp_path / "m.json"),
                "--model-dir", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert "detector model directory" in proc.stderr and "nope" in proc.stderr


def test_detect_flags_and_stdin_agree(models: dict[str, str]) -> None:
    rec = RECORDS[0]
    common = ["--model-dir", models["detector"], "--explainer-dir", models["explainer"]]
    by_flags = _cli("detect", "--context", rec["context"], "--question", rec["question"], "--answer", rec["answer"],
                    *common)
    assert by_flags.returncode == 0, by_flags.stderr
    by_stdin = _cli("detect", *common, stdin=json.dumps({k: rec[k] for k in ("context", "question", "answer")}))
    assert by_stdin.returncode == 0, by_stdin.stderr
    a, b = json.loads(by_flags.stdout), json.loads(by_stdin.stdout)
    assert a["spans"] == b["spans"] and a["score"] == pytest.approx(b["score"])
    assert 0.0 <= a["score"] <= 1.0 and a["detected"] == (a["score"] >= a["response_threshold"])
    assert {m["role"] for m in a["models"]} == {"detector", "explainer", "surrogate"}  # the default config's surrogate
    assert a["signals"] == ["detector", "verifier"]  # a detector without a calibration fit for context PMI: not stacked
    for s in a["spans"]:
        assert s["text"] == rec["answer"][s["start"] : s["end"]]
        assert s["nli_label"] in {"entailment", "neutral", "contradiction"}
        assert s["severity"] in {1, 2, 4}
    assert "verifier" in a["timings_ms"]  # fused (the default) verifies every sentence


def test_detect_without_explainer_has_no_nli_labels(models: dict[str, str]) -> None:
    rec = RECORDS[3]
    proc = _cli("detect", "--context", rec["context"], "--answer", rec["answer"], "--model-dir", models["detector"],
                "--no-explainer", "--compact")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["windows"] > 1
    assert all(s["nli_label"] is None for s in out["spans"])
    assert [m["role"] for m in out["models"]] == ["detector", "surrogate"]
    assert out["signals"] == []  # no verifier: the fused score falls back to the best span, no stacking


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("", "no input"),
        ("{broken", "stdin: invalid JSON"),
        (json.dumps({"context": "c"}), "stdin:1: answer: missing"),
    ],
)
def test_detect_bad_input(stdin: str, message: str, tmp_path: Path) -> None:
    proc = _cli("detect", "--model-dir", str(tmp_path / "unused"), stdin=stdin)
    assert proc.returncode == 2 and message in proc.stderr


def test_detect_answer_flag_requires_context(tmp_path: Path) -> None:
    proc = _cli("detect", "--answer", "x", "--model-dir", str(tmp_path))
    assert proc.returncode == 2 and "--context is required" in proc.stderr
