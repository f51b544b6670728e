"""Train, evaluate and export the detector: which answer tokens does the context not support?

    python -m models.pipelines.detector.train --config models/detector/train.yaml --out models/detector

Reads the span-labelled JSONL that `python -m models.pipelines.hallucination.convert` and
`python -m models.pipelines.hallucination.synthetic` write under data-cache/hallucination (built on
demand, `data.py`), trains a token classifier on all-MiniLM-L6-v2 with the serving template and
windowing (`features.py`), exports int8 ONNX in the inference layer's model-directory format and
picks the operating token threshold on dev from that graph (`export.py`, `evaluate.py`), and writes
metrics.json next to it; `card.py` renders the card from it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from models import shared
from models.pipelines.detector.data import DATA_DIR, build_train, dev_sets, ensure_data
from models.pipelines.detector.evaluate import evaluate, torch_scorer
from models.pipelines.detector.export import evaluate_export, export
from models.pipelines.detector.features import LABELS, Featurizer


class _OutOfTime(Exception):
    pass


def train_with_budget(model: Any, train_ex: list[shared.Example], cfg: dict[str, Any]) -> dict[str, Any]:
    """shared.train, stopped early (and said so) if `max_train_seconds` runs out on a busy machine."""
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
        shared.train(model, train_ex, epochs=cfg.get("epochs", 1.0), batch_size=cfg["batch_size"],
                     lr=float(cfg["lr"]), warmup_ratio=cfg.get("warmup_ratio", 0.06), seed=cfg["seed"],
                     max_steps=cfg.get("max_steps"), log_every=cfg.get("log_every", 10),
                     class_weights=cfg.get("class_weights"), on_log=on_log)
    except _OutOfTime:
        stopped_early = True
    model.eval()
    return {"steps": log[-1][0] if log else 0, "seconds": round(time.perf_counter() - t0, 1),
            "stopped_early_by_time_budget": stopped_early, "loss_log": log}


def run(cfg: dict[str, Any], out_dir: Path, base_dir: Path, data_dir: Path = DATA_DIR,
        export_graph: bool = True, config_path: str = "models/detector/train.yaml") -> dict[str, Any]:
    """Data -> training -> (export + dev metrics of the served graph, or of the torch model)."""
    shared.set_seed(cfg["seed"])
    shared.set_threads(cfg.get("threads"))
    rng = random.Random(cfg["seed"])
    ensure_data(data_dir, sorted(set(cfg["train_mix"]) | set(cfg["dev_limit"])))
    feat = Featurizer.from_file(str(base_dir / "tokenizer.json"), cfg.get("context_overlap", 64))
    train_ex = build_train(cfg, feat, data_dir, rng)
    dev = dev_sets(cfg, data_dir)
    # init_from: continue from an earlier stage's checkpoint (a second pass over fresh records)
    model = shared.load_classifier(cfg.get("init_from") or base_dir, LABELS, task="token",
                                   num_layers=None if cfg.get("init_from") else cfg.get("num_layers"))
    # the embeddings are half of MiniLM's weights
    shared.freeze_lower(model, cfg.get("freeze_layers", 0), embeddings=cfg.get("freeze_embeddings", False))
    res = train_with_budget(model, train_ex, cfg)
    metrics: dict[str, Any] = {
        "train": {"examples": len(train_ex), **res,
                  "by_source": {s: sum(1 for e in train_ex if e.meta["source"] == s) for s in cfg["train_mix"]}},
        "machine": shared.machine_info(),
        "config": cfg,
    }
    shared.write_json(out_dir / "metrics.json", metrics)  # training record survives a failed export
    shared.save_checkpoint(model, base_dir, out_dir / "work" / "hf")
    if export_graph:
        export(cfg, out_dir, metrics, config_path)
        return evaluate_export(cfg, out_dir, metrics, feat, dev)
    metrics["dev"] = evaluate(torch_scorer(model), feat, dev, cfg)
    metrics["dev"]["model"] = "torch fp32"
    metrics["threshold"] = metrics["dev"]["aggregations"]["min"]["threshold"]  # the runtime's rule
    shared.write_json(out_dir / "metrics.json", metrics)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=Path("models/detector/train.yaml"))
    ap.add_argument("--out", type=Path, default=Path("models/detector"))
    ap.add_argument("--data", type=Path, default=DATA_DIR, help="converted JSONL folder")
    ap.add_argument("--max-steps", type=int, default=None, help="override the config (smoke runs)")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--eval-only", action="store_true", help="re-score the exported model in --out on dev")
    args = ap.parse_args(argv)
    cfg = shared.load_yaml(args.config)
    if args.max_steps is not None:
        cfg["max_steps"] = args.max_steps
    if args.eval_only:
        base = shared.base_model_dir(cfg.get("base_model"))
        metrics = json.loads((args.out / "metrics.json").read_text(encoding="utf-8"))
        feat = Featurizer.from_file(str(base / "tokenizer.json"), cfg.get("context_overlap", 64))
        metrics = evaluate_export(cfg, args.out, metrics, feat, dev_sets(cfg, args.data))
    else:
        base = shared.base_model_dir(cfg.get("base_model"))
        metrics = run(cfg, args.out, base, args.data, export_graph=not args.no_export,
                      config_path=args.config.as_posix())
    agg = metrics["dev"]["aggregations"]["min"]
    print(f"threshold {metrics['threshold']}  train {metrics['train']['seconds']}s")
    for src, m in agg["by_source"].items():
        print(f"  {src:24s} ex-F1 {m['example_level']['f1']}  span-F1 {m['span_level_char']['f1']}  AUROC {m['auroc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
