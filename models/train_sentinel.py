"""Train, evaluate and export the sentinel: does this prompt need fact-checking?

    python -m models.train_sentinel --config models/sentinel/train.yaml --out models/sentinel

Labels: 0 = non_factual (code, math, creative, roleplay, chit-chat, opinion), 1 = factual.
Dev sets are whole held-out datasets (listed in the config), so dev accuracy measures
generalisation to unseen phrasing and sources, not memorised templates.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from models import common
from models.export_util import export_classifier, sentinel_input, set_recommended_threshold
from models.sentinel_data import load_source

LABELS = ["non_factual", "factual"]


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def augment_question(text: str, rng: random.Random, p_add: float, p_strip: float) -> str:
    """Decorrelate '?' from the label: NQ queries have none, most other questions do."""
    stripped = text.rstrip()
    if stripped.endswith("?"):
        return stripped.rstrip("?").rstrip() if rng.random() < p_strip else stripped
    return stripped + "?" if rng.random() < p_add else stripped


Item = tuple[str, int, str]  # (prompt, label, source)


def build_splits(cfg: dict[str, Any], data_dir: Path) -> dict[str, list[Item]]:
    """train / dev / borderline items from the config's source lists (whole sources per split)."""
    rng = random.Random(cfg["seed"])
    cap = cfg["data"].get("max_per_source")
    aug = cfg["data"].get("augment", {})
    splits: dict[str, list[Item]] = {"train": [], "dev": [], "borderline": []}
    for split in splits:
        for label_name, sources in (cfg["data"].get(split) or {}).items():
            label = LABELS.index(label_name)
            for src in sources:
                texts = load_source(src, data_dir)
                src_cap = (cfg["data"].get("caps") or {}).get(src, cap)
                if split == "train" and src_cap and len(texts) > src_cap:
                    texts = rng.sample(texts, src_cap)
                splits[split].extend((t, label, src) for t in texts)
    # No dev prompt may also be a training prompt (FreebaseQA/Mintaka/TriviaQA share trivia).
    seen = {_norm(t) for t, _, _ in splits["train"]}
    for split in ("dev", "borderline"):
        splits[split] = [it for it in splits[split] if _norm(it[0]) not in seen]
    if aug:
        splits["train"] = [
            (augment_question(t, rng, aug.get("add_qmark", 0.0), aug.get("strip_qmark", 0.0))
             if y == 1 else t, y, s)
            for t, y, s in splits["train"]
        ]
    rng.shuffle(splits["train"])
    return splits


def pick_threshold(p_factual: np.ndarray, y: np.ndarray) -> float:
    """Threshold that maximises balanced accuracy on dev (ties -> closest to 0.5)."""
    best, best_t = -1.0, 0.5
    for t in sorted(set(np.round(np.linspace(0.05, 0.95, 91), 2)), key=lambda v: abs(v - 0.5)):
        pred = (p_factual >= t).astype(int)
        bal = np.mean([np.mean(pred[y == c] == c) for c in (0, 1) if np.any(y == c)])
        if bal > best + 1e-9:
            best, best_t = bal, float(t)
    return best_t


def predict(model, tok, items: Sequence[Item]) -> np.ndarray:
    """p(factual) per item, inputs built with the serving template."""
    exs = common.encode(tok, [sentinel_input(t) for t, _, _ in items], [y for _, y, _ in items])
    return common.predict_proba(model, exs)[:, 1]


def report(items: Sequence[Item], p: np.ndarray, threshold: float) -> dict[str, Any]:
    y = np.array([lab for _, lab, _ in items])
    pred = (p >= threshold).astype(int)
    rep = common.classification_report(y.tolist(), pred.tolist(), LABELS)
    rep["balanced_accuracy"] = round(float(np.mean([np.mean(pred[y == c] == c) for c in (0, 1) if np.any(y == c)])), 4)
    rep["threshold"] = threshold
    rep["per_source"] = common.accuracy_by([s for _, _, s in items], y.tolist(), pred.tolist())
    return rep


def run(cfg: dict[str, Any], splits: dict[str, list[Item]], out_dir: Path, base_dir: Path,
        max_steps: int | None = None) -> dict[str, Any]:
    """Train on splits['train'], pick the threshold on dev, export to out_dir, return metrics."""
    common.set_seed(cfg["seed"])
    common.set_threads(cfg.get("threads"))
    hp = cfg["train"]
    tok = common.load_tokenizer(base_dir, cfg["max_length"])
    train_items = splits["train"]
    counts = np.bincount([y for _, y, _ in train_items], minlength=2)
    weights = (counts.sum() / (2 * np.maximum(counts, 1))).tolist()
    exs = common.encode(tok, [sentinel_input(t) for t, _, _ in train_items], [y for _, y, _ in train_items])
    model = common.load_classifier(base_dir, LABELS)
    log = lambda step, loss: print(f"step {step} loss {loss:.4f}", flush=True)  # noqa: E731
    with common.timed() as t_train:
        res = common.train(model, exs, epochs=hp["epochs"], batch_size=hp["batch_size"], lr=hp["lr"],
                           weight_decay=hp["weight_decay"], warmup_ratio=hp["warmup_ratio"], seed=cfg["seed"],
                           max_steps=max_steps, log_every=hp.get("log_every", 50), class_weights=weights, on_log=log,
                           freeze_layers=hp.get("freeze_layers", 0), max_seconds=hp.get("max_seconds"))
    metrics: dict[str, Any] = {
        "model": "sentinel", "labels": LABELS, "seed": cfg["seed"], "max_length": cfg["max_length"],
        "train": {"examples": len(exs), "per_class": counts.tolist(), "class_weights": weights,
                  "steps": res.steps, "planned_steps": res.planned_steps, "stopped_early": res.stopped_early,
                  "seconds": t_train["seconds"], "loss_curve": res.losses,
                  "per_source": {s: sum(1 for _, _, x in train_items if x == s) for s in sorted({x for _, _, x in train_items})}},
        "machine": common.machine_info(),
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
    work = out_dir / "work"
    model.save_pretrained(str(work / "hf"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (base_dir / name).is_file():
            (work / "hf" / name).write_bytes((base_dir / name).read_bytes())
    return metrics


def export(cfg: dict[str, Any], out_dir: Path, threshold: float) -> dict[str, Any]:
    """work/hf -> int8 ONNX model directory in out_dir; returns the parity report + seconds."""
    with common.timed() as t_export:
        parity = export_classifier(out_dir / "work" / "hf", "sentinel", out_dir, LABELS, cfg["max_length"],
                          threshold=threshold, per_channel=bool((cfg.get("export") or {}).get("per_channel")),
                          provenance={"base_model": common.BASE_MODEL_NAME, "seed": cfg["seed"],
                                      "config": "models/sentinel/train.yaml"})
    per_channel = {"per_channel": True} if (cfg.get("export") or {}).get("per_channel") else {}
    return {"seconds": t_export["seconds"], **per_channel,
            **{k: v for k, v in parity.items() if "diff" in k or k == "ok"}}


def evaluate_served(out_dir: Path, splits: dict[str, list[Item]], metrics: dict[str, Any]) -> None:
    """Dev metrics from the exported int8 graph through the serving wrapper (what users get).

    The threshold is re-picked on these probabilities (int8 shifts logits) and written into
    the manifest; the fp32 torch numbers stay in metrics as `dev_torch_fp32`.
    """
    from extproc.inference.models import OnnxModel, Sentinel
    from extproc.inference.runtime import RuntimeOptions

    served = Sentinel(OnnxModel(out_dir, "sentinel", RuntimeOptions(provider="cpu", intra_op_threads=1)))
    if "dev" in metrics and "dev_torch_fp32" not in metrics:
        metrics["dev_torch_fp32"] = metrics.pop("dev")
        metrics["threshold_torch_fp32"] = metrics["threshold"]
    p = np.array(served.predict_batch([t for t, _, _ in splits["dev"]]))
    thr = pick_threshold(p, np.array([y for _, y, _ in splits["dev"]]))
    metrics["threshold"] = thr
    metrics["dev_at_0.5"] = report(splits["dev"], p, 0.5)
    metrics["dev"] = report(splits["dev"], p, thr)
    metrics["dev"]["graph"] = "int8 ONNX via extproc.inference.Sentinel"
    if splits.get("borderline"):
        pb = np.array(served.predict_batch([t for t, _, _ in splits["borderline"]]))
        metrics["borderline"] = report(splits["borderline"], pb, thr)
    set_recommended_threshold(out_dir, thr)


def main(argv: Sequence[str] | None = None) -> int:
    ap = common.classifier_cli(__doc__.splitlines()[0], "sentinel", common.SHARED_DATA / "prompts")
    args = ap.parse_args(argv)
    cfg = common.load_yaml(args.config)
    base = Path(args.base) if args.base else common.base_model_dir()
    out = Path(args.out)
    splits = build_splits(cfg, Path(args.data))
    print({k: len(v) for k, v in splits.items()}, flush=True)
    if args.export_only or args.eval_only:
        metrics = json.loads((out / "metrics.json").read_text())
    else:
        metrics = run(cfg, splits, out, base, max_steps=args.max_steps)
        common.write_json(out / "metrics.json", metrics)
    if not args.eval_only:
        metrics["export"] = export(cfg, out, metrics.get("threshold_torch_fp32", metrics["threshold"]))
    metrics.pop("export_seconds", None)
    if cfg.get("notes"):  # the config's own account of what changed, rendered into the card
        metrics["notes"] = list(cfg["notes"])
    metrics["model_bytes"] = common.dir_size_bytes(out) - common.dir_size_bytes(out / "work")
    if splits["dev"]:
        evaluate_served(out, splits, metrics)
    common.write_json(out / "metrics.json", metrics)
    dev = metrics.get("dev", {})
    print(f"dev accuracy {dev.get('accuracy')} balanced {dev.get('balanced_accuracy')} "
          f"threshold {metrics['threshold']} train {metrics['train']['seconds']}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
