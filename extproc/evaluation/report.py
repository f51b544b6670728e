"""Human-readable summary of an eval report (the JSON file is the record)."""

from __future__ import annotations

from typing import Any

from extproc.evaluation.runner import iter_tasks


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(report: dict[str, Any]) -> str:
    header = (
        f"{'task':<18} {'n':>6} {'pos':>5}  {'ex P':>6} {'ex R':>6} {'ex F1':>6}  "
        f"{'chr P':>6} {'chr R':>6} {'chr F1':>6}  {'tok F1':>6}  {'AUROC':>6}  {'p50 ms':>8} {'p95 ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for task, m in iter_tasks(report):
        ex, ch, tok, lat = m["example_level"], m["span_level_char"], m["token_level"], m["latency_ms"]
        lines.append(
            f"{task[:18]:<18} {m['examples']:>6} {m['hallucinated_examples']:>5}  "
            f"{_f(ex['precision']):>6} {_f(ex['recall']):>6} {_f(ex['f1']):>6}  "
            f"{_f(ch['precision']):>6} {_f(ch['recall']):>6} {_f(ch['f1']):>6}  "
            f"{_f(tok['f1']):>6}  {_f(m['auroc']):>6}  {_f(lat['p50'], 1):>8} {_f(lat['p95'], 1):>8}"
        )
    lines.append("'-' = undefined (zero denominator or a single class); definitions are in the JSON report.")
    if report.get("unchecked"):
        counts = ", ".join(f"{reason} {n}" for reason, n in report["unchecked"].items())
        lines.append(f"unchecked, as the gateway would pass them (counted as not flagged, score 0): {counts}")
    return "\n".join(lines)
