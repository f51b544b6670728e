"""Detector dev metrics, on the torch checkpoint or the exported int8 graph, windowed as serving does.

Every window of every dev record is scored; per answer token the windows are combined ("min": the
runtime's `aggregate_windows`; "max": the rule it replaced, kept for comparison). Example-level
P/R/F1, pooled character-span P/R/F1 and AUROC come from `extproc.evaluation.metrics`, the
functions `truthlens eval` reports with, so card numbers and eval numbers are one computation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from extproc.evaluation.metrics import CharOverlap, Confusion, auroc
from extproc.inference.windowing import PairInput, Row, aggregate_windows
from models import shared
from models.pipelines.detector.features import Featurizer

RowScorer = Callable[[Sequence[Row]], list[np.ndarray]]


def aggregate(pin: PairInput, row_probs: Sequence[np.ndarray], how: str) -> np.ndarray:
    """Per answer token probability over all rows: "min" is the runtime's evidence-aware rule
    (`aggregate_windows`: min over context windows), "max" the rule it replaced, kept for comparison."""
    if how == "min":
        return aggregate_windows(pin, row_probs)
    agg = np.zeros(pin.second_len, dtype=np.float32)
    for row, p in zip(pin.rows, row_probs):
        seg = p[row.second_start: row.second_start + row.second_count]
        tgt = agg[row.second_first: row.second_first + row.second_count]
        np.maximum(tgt, seg, out=tgt)
    return agg


def predicted_spans(offsets: Sequence[tuple[int, int]], probs: np.ndarray, t: float) -> list[tuple[int, int]]:
    """Merge flagged tokens into character spans (adjacent or whitespace-separated tokens join)."""
    spans: list[list[int]] = []
    for (s, e), p in zip(offsets, probs):
        if e <= s or p < t:
            continue
        if spans and s - spans[-1][1] <= 1:
            spans[-1][1] = e
        else:
            spans.append([s, e])
    return [(s, e) for s, e in spans]


def _rounded(prf: Mapping[str, Any]) -> dict[str, float | None]:
    return {k: None if prf[k] is None else round(prf[k], 4) for k in ("precision", "recall", "f1")}


def metrics_at(items: Sequence[dict[str, Any]], t: float) -> dict[str, Any]:
    """Example-level P/R/F1, pooled character-span P/R/F1 and AUROC for one threshold.

    items: {"answer_len", "gold": [(s, e)], "offsets", "probs"} per dev record. An answer is
    flagged when any token reaches `t`; its AUROC score is its highest token probability.
    """
    examples, chars = Confusion(), CharOverlap()
    for it in items:
        spans = predicted_spans(it["offsets"], it["probs"], t)
        examples.add(bool(spans), bool(it["gold"]))
        chars.add(spans, it["gold"])
    scores = [float(it["probs"].max()) if len(it["probs"]) else 0.0 for it in items]
    au = auroc(scores, [bool(it["gold"]) for it in items])
    ex = examples.prf()
    return {
        "n": len(items), "positives": examples.tp + examples.fn,
        "example_level": {**_rounded(ex), "tp": ex["tp"], "fp": ex["fp"], "fn": ex["fn"], "tn": ex["tn"]},
        "span_level_char": _rounded(chars.prf()),
        "auroc": None if au is None else round(au, 4),
    }


def torch_scorer(model: Any, batch_size: int = 16) -> RowScorer:
    """P(hallucinated) per row position from the in-memory torch model."""
    import torch

    @torch.no_grad()
    def score(rows: Sequence[Row]) -> list[np.ndarray]:
        model.eval()
        device = shared.model_device(model)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out: list[np.ndarray] = [np.zeros(0)] * len(rows)
        for b in range(0, len(order), batch_size):
            idx = order[b: b + batch_size]
            t = shared.collate([shared.Example(list(rows[i].input_ids), list(rows[i].type_ids), 0) for i in idx])
            t.pop("labels")
            t = {k: v.to(device) for k, v in t.items()}
            p = torch.softmax(model(**t).logits.float(), dim=-1)[..., 1].cpu().numpy()
            for i, pr in zip(idx, p):
                out[i] = pr[: len(rows[i])]
        return out

    return score


def onnx_scorer(model_dir: Path, threads: int) -> RowScorer:
    """The exported int8 graph through the serving OnnxModel (what the gateway will run)."""
    from extproc.inference.models import OnnxModel
    from extproc.inference.runtime import RuntimeOptions

    model = OnnxModel(model_dir, "detector", RuntimeOptions(provider="cpu", intra_op_threads=threads))
    pos = model.manifest.positive_index
    return lambda rows: [p[:, pos] for p in model.infer(rows)]


def dev_items(score: RowScorer, feat: Featurizer, recs: Sequence[dict[str, Any]], max_length: int
              ) -> list[dict[str, Any]]:
    """Run every window of every record (as serving does); keep per-token probs under both window rules."""
    pins = [feat.pair(r, max_length) for r in recs]
    probs = score([row for p in pins for row in p.rows])
    items, k = [], 0
    for rec, pin in zip(recs, pins):
        rows = probs[k: k + len(pin.rows)]
        k += len(pin.rows)
        items.append({
            "source": rec.get("source", ""), "answer_len": len(rec["answer"]),
            "gold": [(s["start"], s["end"]) for s in rec["labels"]], "offsets": pin.second_offsets,
            "max": aggregate(pin, rows, "max"), "min": aggregate(pin, rows, "min"), "windows": len(pin.rows),
        })
    return items


def _with(items: Sequence[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    return [{**it, "probs": it[how]} for it in items]


def pick_threshold(f1_by_threshold: Mapping[float, float | None]) -> float:
    """Token threshold with the best example-level F1 on the threshold-selection dev items (ties -> nearer 0.5)."""
    best, best_t = -1.0, 0.5
    for t in sorted(f1_by_threshold, key=lambda v: abs(v - 0.5)):
        f1 = f1_by_threshold[t] or 0.0
        if f1 > best + 1e-9:
            best, best_t = f1, float(t)
    return best_t


def evaluate(score: RowScorer, feat: Featurizer, dev: dict[str, list[dict[str, Any]]], cfg: dict[str, Any]
             ) -> dict[str, Any]:
    """Per-source dev metrics for both window aggregations; threshold chosen on cfg's sources."""
    with shared.timed() as t_eval:
        items = {src: dev_items(score, feat, recs, cfg["max_length"]) for src, recs in dev.items()}
    grid = [round(x, 2) for x in np.arange(0.05, 0.96, 0.05)]
    chosen = [it for s in cfg["threshold_sources"] if s in items for it in items[s]]
    out: dict[str, Any] = {"eval_seconds": t_eval["seconds"], "aggregations": {}}
    for how in ("max", "min"):
        pooled = _with(chosen, how)
        # one pass over the grid: it picks the threshold and is kept (precision / recall / faithful answers
        # flagged per threshold) for operators trading recall for fewer alarms
        sweep = {t: metrics_at(pooled, t)["example_level"] for t in grid}
        thr = pick_threshold({t: ex["f1"] for t, ex in sweep.items()})
        per = {src: metrics_at(_with(its, how), thr) for src, its in items.items()}
        out["aggregations"][how] = {
            "threshold": thr, "by_source": per,
            "threshold_sweep": {str(t): {k: ex[k] for k in ("precision", "recall", "f1", "fp", "tn")}
                                for t, ex in sweep.items()},
        }
    out["windows_mean"] = {s: round(float(np.mean([i["windows"] for i in its])), 2) for s, its in items.items()}
    return out
