"""Train, evaluate and export the detector: which answer tokens does the context not support?

    python -m models.train_detector --config models/detector/train.yaml --out models/detector

Reads the span-labelled JSONL that `python -m models.data.convert` and
`python -m models.data.synthetic` write under data-cache/hallucination (built on demand),
trains a token classifier on all-MiniLM-L6-v2 with the serving template and windowing,
picks the operating token threshold on dev, exports int8 ONNX in the inference layer's
model-directory format and writes metrics.json next to it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from models import common
from extproc.inference.windowing import Row
from models.data.records import read_jsonl
from models.detector_features import TEMPLATE, Featurizer, aggregate, metrics_at, training_example

LABELS = ["supported", "hallucinated"]
DATA_DIR = common.REPO_ROOT / "data-cache" / "hallucination"


def ensure_data(data_dir: Path, sources: Sequence[str]) -> None:
    """Build the converted sets when a needed file is missing (fresh checkout, `make models`)."""
    need = [s for s in sources if not (data_dir / f"{s}.train.jsonl").is_file()]
    if not need:
        return
    from models.data import convert, synthetic

    real = [s for s in need if s in convert.SOURCES]
    if real:
        convert.main(["--out", str(data_dir), "--sources", *real])
    if "synthetic_qa" in need:
        synthetic.main(["--out", str(data_dir)])


def sample(path: Path, n: int | str | None, rng: random.Random) -> list[dict[str, Any]]:
    """n records (stratified: half hallucinated where possible); 'all'/None = the whole file."""
    recs = list(read_jsonl(path))
    if n in (None, "all") or int(n) >= len(recs):
        return recs
    n = int(n)
    pos = [r for r in recs if r["labels"]]
    neg = [r for r in recs if not r["labels"]]
    rng.shuffle(pos)
    rng.shuffle(neg)
    k = min(len(pos), n // 2)
    picked = pos[:k] + neg[: n - k]
    if len(picked) < n:
        picked += pos[k: k + n - len(picked)]
    return picked


RowScorer = Callable[[Sequence[Row]], list[np.ndarray]]


def torch_scorer(model: Any, batch_size: int = 16) -> RowScorer:
    """P(hallucinated) per row position from the in-memory torch model."""
    torch = common.torch

    @torch.no_grad()
    def score(rows: Sequence[Row]) -> list[np.ndarray]:
        model.eval()
        device = common.model_device(model)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out: list[np.ndarray] = [np.zeros(0)] * len(rows)
        for b in range(0, len(order), batch_size):
            idx = order[b: b + batch_size]
            t = common.collate([common.Example(list(rows[i].input_ids), list(rows[i].type_ids), 0) for i in idx])
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
    with common.timed() as t_eval:
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


def build_train(cfg: dict[str, Any], feat: Featurizer, data_dir: Path, rng: random.Random) -> list[common.Example]:
    """Training rows per source; a source with longer contexts may get longer rows
    (`train_max_length_by_source`) so its evidence is not windowed away."""
    exs = []
    longer = cfg.get("train_max_length_by_source") or {}
    for src, n in cfg["train_mix"].items():
        length = int(longer.get(src, cfg["train_max_length"]))
        for rec in sample(data_dir / f"{src}.train.jsonl", n, rng):
            exs.append(training_example(feat, rec, length))
    return exs


def freeze(model: Any, embeddings: bool, layers: int) -> None:
    """Freeze the embeddings (half of MiniLM's weights) and the lowest encoder layers: on a
    shared 2-core CPU the optimizer step and backward pass dominate, and the top layers
    carry most of what token classification needs."""
    parts = ([model.base_model.embeddings] if embeddings else []) + list(model.base_model.encoder.layer[:layers])
    for part in parts:
        for p in part.parameters():
            p.requires_grad = False


class _OutOfTime(Exception):
    pass


def train_with_budget(model: Any, train_ex: list[common.Example], cfg: dict[str, Any]) -> dict[str, Any]:
    """common.train, stopped early (and said so) if `max_train_seconds` runs out on a busy machine."""
    t0 = time.perf_counter()
    budget = cfg.get("max_train_seconds")
    log: list[tuple[int, float]] = []

    def on_log(step: int, loss: float) -> None:
        el = time.perf_counter() - t0
        log.append((step, round(loss, 4)))
        print(f"step {step} loss {loss:.4f} {el / step:.2f}s/step elapsed {el:.0f}s", flush=True)
        if budget and el > budget:
            raise _OutOfTime

    stopped_early = False
    try:
        common.train(model, train_ex, epochs=cfg.get("epochs", 1.0), batch_size=cfg["batch_size"],
                     lr=float(cfg["lr"]), warmup_ratio=cfg.get("warmup_ratio", 0.06), seed=cfg["seed"],
                     max_steps=cfg.get("max_steps"), log_every=cfg.get("log_every", 10),
                     class_weights=cfg.get("class_weights"), on_log=on_log)
    except _OutOfTime:
        stopped_early = True
    model.eval()
    return {"steps": log[-1][0] if log else 0, "seconds": round(time.perf_counter() - t0, 1),
            "stopped_early_by_time_budget": stopped_early, "loss_log": log}


def run(cfg: dict[str, Any], out_dir: Path, base_dir: Path, data_dir: Path = DATA_DIR,
        export: bool = True, config_path: str = "models/detector/train.yaml") -> dict[str, Any]:
    common.set_seed(cfg["seed"])
    common.set_threads(cfg.get("threads"))
    rng = random.Random(cfg["seed"])
    ensure_data(data_dir, sorted(set(cfg["train_mix"]) | set(cfg["dev_limit"])))
    feat = Featurizer.from_file(str(base_dir / "tokenizer.json"), cfg.get("context_overlap", 64))
    train_ex = build_train(cfg, feat, data_dir, rng)
    dev = dev_sets(cfg, data_dir)
    # init_from: continue from an earlier stage's checkpoint (a second pass over fresh records)
    model = common.load_classifier(cfg.get("init_from") or base_dir, LABELS, task="token",
                                   num_layers=None if cfg.get("init_from") else cfg.get("num_layers"))
    freeze(model, cfg.get("freeze_embeddings", False), cfg.get("freeze_layers", 0))
    res = train_with_budget(model, train_ex, cfg)
    metrics: dict[str, Any] = {
        "train": {"examples": len(train_ex), **res,
                  "by_source": {s: sum(1 for e in train_ex if e.meta["source"] == s) for s in cfg["train_mix"]}},
        "machine": common.machine_info(),
        "config": cfg,
    }
    common.write_json(out_dir / "metrics.json", metrics)  # training record survives a failed export
    work = out_dir / "work"
    model.save_pretrained(str(work / "hf"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (base_dir / name).is_file():
            (work / "hf" / name).write_bytes((base_dir / name).read_bytes())
    if export:
        from extproc.inference.export import export_model

        with common.timed() as t_exp:
            rep = export_model(str(work / "hf"), "token-classification", str(out_dir), quantize="int8",
                               optimize=bool((cfg.get("export") or {}).get("optimize")),
                               labels=LABELS, template=TEMPLATE, max_length=cfg["max_length"],
                               context_overlap=cfg.get("context_overlap", 64),
                               provenance={"base_model": common.BASE_MODEL_NAME, "seed": cfg["seed"],
                                           "train_config": config_path})
        metrics["export"] = {"seconds": t_exp["seconds"], **{k: v for k, v in rep.items() if k != "out_dir"}}
        metrics["size_bytes"] = (out_dir / "model.onnx").stat().st_size
        return evaluate_export(cfg, out_dir, metrics, feat, dev)
    metrics["dev"] = evaluate(torch_scorer(model), feat, dev, cfg)
    metrics["dev"]["model"] = "torch fp32"
    metrics["threshold"] = metrics["dev"]["aggregations"]["min"]["threshold"]  # the runtime's rule
    common.write_json(out_dir / "metrics.json", metrics)
    return metrics


def dev_sets(cfg: dict[str, Any], data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    return {src: sample(data_dir / f"{src}.dev.jsonl", n, random.Random(cfg.get("dev_seed", cfg["seed"])))
            for src, n in cfg["dev_limit"].items()}


def evaluate_export(cfg: dict[str, Any], out_dir: Path, metrics: dict[str, Any], feat: Featurizer,
                    dev: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Dev metrics from the int8 graph the gateway serves (also ~2x cheaper than torch on CPU);
    the chosen threshold goes into the manifest and metrics.json."""
    metrics["dev"] = evaluate(onnx_scorer(out_dir, cfg.get("threads") or 2), feat, dev, cfg)
    metrics["dev"]["model"] = "int8 onnx (serving graph)"
    metrics["threshold"] = metrics["dev"]["aggregations"]["min"]["threshold"]  # the runtime's rule (aggregate_windows)
    record_threshold(out_dir, metrics["threshold"])
    common.write_json(out_dir / "metrics.json", metrics)
    return metrics


def record_threshold(out_dir: Path, threshold: float) -> None:
    """Store the dev-chosen token threshold in the manifest's provenance (the card repeats it)."""
    from extproc.inference.manifest import load_manifest

    m = load_manifest(out_dir)
    data = m.to_json()
    data["provenance"] = {**data["provenance"], "recommended_token_threshold": threshold}
    (out_dir / "truthlens.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=Path("models/detector/train.yaml"))
    ap.add_argument("--out", type=Path, default=Path("models/detector"))
    ap.add_argument("--data", type=Path, default=DATA_DIR, help="converted JSONL folder")
    ap.add_argument("--max-steps", type=int, default=None, help="override the config (smoke runs)")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--eval-only", action="store_true", help="re-score the exported model in --out on dev")
    args = ap.parse_args(argv)
    cfg = common.load_yaml(args.config)
    if args.max_steps is not None:
        cfg["max_steps"] = args.max_steps
    if args.eval_only:
        base = common.base_model_dir()
        metrics = json.loads((args.out / "metrics.json").read_text(encoding="utf-8"))
        feat = Featurizer.from_file(str(base / "tokenizer.json"), cfg.get("context_overlap", 64))
        metrics = evaluate_export(cfg, args.out, metrics, feat, dev_sets(cfg, args.data))
    else:
        metrics = run(cfg, args.out, common.base_model_dir(), args.data, export=not args.no_export,
                      config_path=args.config.as_posix())
    agg = metrics["dev"]["aggregations"]["min"]
    print(f"threshold {metrics['threshold']}  train {metrics['train']['seconds']}s")
    for src, m in agg["by_source"].items():
        print(f"  {src:24s} ex-F1 {m['example_level']['f1']}  span-F1 {m['span_level_char']['f1']}  AUROC {m['auroc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
