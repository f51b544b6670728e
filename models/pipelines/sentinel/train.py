"""Train, evaluate and export the sentinel: does this prompt need fact-checking?

    python -m models.pipelines.sentinel.train --config models/sentinel/train.yaml --out models/sentinel

Data from `data.py` (whole held-out sources as dev), fine-tuning here, export and the served
graph's dev metrics in `export.py`; metrics.json lands in --out, and `card.py` renders the card from it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from extproc.inference.templates import sentinel_text
from models import shared
from models.pipelines.sentinel.data import LABELS, Item, build_splits
from models.pipelines.sentinel.evaluate import pick_threshold, predict, report
from models.pipelines.sentinel.export import evaluate_served, export


def run(cfg: dict[str, Any], splits: dict[str, list[Item]], out_dir: Path, base_dir: Path,
        max_steps: int | None = None) -> dict[str, Any]:
    """Train on splits['train'], pick the threshold on dev, save work/hf in out_dir, return metrics."""
    shared.set_seed(cfg["seed"])
    shared.set_threads(cfg.get("threads"))
    hp = cfg["train"]
    tok = shared.load_tokenizer(base_dir, cfg["max_length"])
    train_items = splits["train"]
    counts = np.bincount([y for _, y, _ in train_items], minlength=2)
    weights = (counts.sum() / (2 * np.maximum(counts, 1))).tolist()
    exs = shared.encode(tok, [sentinel_text(t) for t, _, _ in train_items], [y for _, y, _ in train_items])
    model = shared.load_classifier(base_dir, LABELS)
    log = lambda step, loss: print(f"step {step} loss {loss:.4f}", flush=True)  # noqa: E731
    with shared.timed() as t_train:
        res = shared.train(model, exs, epochs=hp["epochs"], batch_size=hp["batch_size"], lr=hp["lr"],
                           weight_decay=hp["weight_decay"], warmup_ratio=hp["warmup_ratio"], seed=cfg["seed"],
                           max_steps=max_steps, log_every=hp.get("log_every", 50), class_weights=weights, on_log=log,
                           freeze_layers=hp.get("freeze_layers", 0), max_seconds=hp.get("max_seconds"))
    metrics: dict[str, Any] = {
        "model": "sentinel", "labels": LABELS, "seed": cfg["seed"], "max_length": cfg["max_length"],
        "train": {"examples": len(exs), "per_class": counts.tolist(), "class_weights": weights,
                  "steps": res.steps, "planned_steps": res.planned_steps, "stopped_early": res.stopped_early,
                  "seconds": t_train["seconds"], "loss_curve": res.losses,
                  "per_source": {s: sum(1 for _, _, x in train_items if x == s) for s in sorted({x for _, _, x in train_items})}},
        "machine": shared.machine_info(),
    }
    if splits["dev"]:
        p_dev = predict(model, tok, splits["dev"])
        thr = pick_threshold(p_dev, np.array([y for _, y, _ in splits["dev"]]))
        metrics["dev_at_0.5"] = report(splits["dev"], p_dev, 0.5)
        metrics["dev"] = report(splits["dev"], p_dev, thr)
        metrics["threshold"] = thr
    else:
        metrics["threshold"] = 0.5
    if splits.get("borderline"):
        metrics["borderline"] = report(splits["borderline"], predict(model, tok, splits["borderline"]),
                                       metrics["threshold"])
    shared.save_checkpoint(model, base_dir, out_dir / "work" / "hf")
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    ap = shared.classifier_cli(__doc__.splitlines()[0], "sentinel", shared.SHARED_DATA / "prompts")
    args = ap.parse_args(argv)
    cfg = shared.load_yaml(args.config)
    base = Path(args.base) if args.base else shared.base_model_dir(cfg.get("base_model"))
    out = Path(args.out)
    splits = build_splits(cfg, Path(args.data))
    print({k: len(v) for k, v in splits.items()}, flush=True)
    metrics = shared.load_or_train(args, out, lambda: run(cfg, splits, out, base, max_steps=args.max_steps))
    if not args.eval_only:
        metrics["export"] = export(cfg, out, metrics.get("threshold_torch_fp32", metrics["threshold"]))
    metrics.pop("export_seconds", None)
    shared.add_card_facts(cfg, out, metrics)
    if splits["dev"]:
        evaluate_served(out, splits, metrics)
    shared.write_json(out / "metrics.json", metrics)
    dev = metrics.get("dev", {})
    print(f"dev accuracy {dev.get('accuracy')} balanced {dev.get('balanced_accuracy')} "
          f"threshold {metrics['threshold']} train {metrics['train']['seconds']}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
