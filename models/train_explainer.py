"""Train, evaluate and export the explainer: 3-way NLI over (premise, hypothesis).

    python -m models.train_explainer --config models/explainer/train.yaml --out models/explainer
    python -m models.train_explainer --config models/verifier/train.yaml --out models/verifier

Labels: entailment, neutral, contradiction (the gateway drops a flagged span when the
context entails the sentence holding it). Accuracy is reported per held-out source.
A config with `data.grounding` also trains on answer sentences against their context window
(models/verifier_data.py), with the loss on P(entailment) alone for unsupported sentences:
that model is the grounding verifier.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from models import common
from models.explainer_data import LABELS, Pair, load_source
from models.verifier_data import NOT_SUPPORTED, load_grounding
from models.export_util import export_classifier, nli_input, set_recommended_threshold

Item = tuple[str, str, int, str]  # (premise, hypothesis, label index, source)


def build_splits(cfg: dict[str, Any], data_dir: Path) -> dict[str, list[Item]]:
    """Training mix (per-source caps) and per-source held-out test samples."""
    rng = random.Random(cfg["seed"])
    data = cfg["data"]
    train: list[Item] = []
    test: list[Item] = []
    for src in sorted(set(data["train"]) | set(data["test"])):
        split = load_source(src, data_dir)

        def take(pairs: list[Pair], cap: int | None) -> list[Pair]:
            return rng.sample(pairs, cap) if cap and len(pairs) > cap else list(pairs)

        if src in data["train"]:
            train += [(p, h, LABELS.index(y), src) for p, h, y in take(split["train"], data["train"][src])]
        if src in data["test"]:
            test += [(p, h, LABELS.index(y), src) for p, h, y in take(split["test"], data["test"][src])]
    grounding = data.get("grounding") or {}
    if grounding:
        train += load_grounding(grounding, Path(data.get("grounding_dir", common.REPO_ROOT / "data-cache/hallucination")),
                                int(cfg.get("premise_words", 160)), rng)
    rng.shuffle(train)
    return {"train": train, "test": test}


def nli_or_grounding_loss(logits, labels):  # type: ignore[no-untyped-def]
    """Cross-entropy for NLI labels; -log(1 - P(entailment)) for NOT_SUPPORTED sentences."""
    import torch

    logp = torch.log_softmax(logits, dim=-1)
    nli = labels < NOT_SUPPORTED
    ce = -logp[nli].gather(1, labels[nli][:, None])[:, 0]
    not_entailed = -torch.logsumexp(logp[~nli][:, 1:], dim=1)
    return torch.cat([ce, not_entailed]).mean()


def predict(model, tok, items: Sequence[Item]) -> np.ndarray:
    exs = common.encode(tok, [nli_input(p, h) for p, h, _, _ in items], [y for _, _, y, _ in items])
    return common.predict_proba(model, exs)


def report(items: Sequence[Item], probs: np.ndarray, two_way: Sequence[str]) -> dict[str, Any]:
    """3-way accuracy overall and per source; 2-way sources (no neutral gold) also get
    accuracy with the prediction restricted to entailment vs contradiction."""
    y = [it[2] for it in items]
    pred = probs.argmax(1).tolist()
    rep = common.classification_report(y, pred, list(LABELS))
    rep["per_source"] = common.accuracy_by([it[3] for it in items], y, pred)
    for src in two_way:
        idx = [i for i, it in enumerate(items) if it[3] == src]
        if idx:
            sub = probs[idx][:, [0, 2]].argmax(1) * 2
            rep["per_source"][src]["accuracy_2way"] = round(float(np.mean(sub == np.array(y)[idx])), 4)
    return rep


def entailment_threshold(items: Sequence[Item], probs: np.ndarray, precision: float) -> dict[str, Any]:
    """Lowest P(entailment) cut whose entailment precision on the test mix reaches `precision`.

    Dropping a span on a false 'entailed' hides a hallucination, so the default is precision-first.
    If no cut reaches the target, the most precise cut (>= 20 pairs kept) is returned, flagged.
    """
    y = np.array([it[2] for it in items])
    pe = probs[:, 0]
    best: dict[str, Any] | None = None
    for t in np.round(np.arange(0.5, 0.991, 0.01), 2):
        sel = pe >= t
        if sel.sum() < 20:
            break
        prec = float(np.mean(y[sel] == 0))
        found = {"threshold": float(t), "precision": round(prec, 4), "recall": round(float(sel[y == 0].mean()), 4),
                 "target_precision": precision, "target_met": prec >= precision}
        if prec >= precision:
            return found
        if best is None or prec > best["precision"]:
            best = found
    return best or {"threshold": 0.99, "precision": None, "recall": None, "target_precision": precision,
                    "target_met": False}


def run(cfg: dict[str, Any], splits: dict[str, list[Item]], out_dir: Path, base_dir: Path,
        max_steps: int | None = None) -> dict[str, Any]:
    common.set_seed(cfg["seed"])
    common.set_threads(cfg.get("threads"))
    hp = cfg["train"]
    tok = common.load_tokenizer(base_dir, cfg["max_length"])
    items = splits["train"]
    exs = common.encode(tok, [nli_input(p, h) for p, h, _, _ in items], [y for _, _, y, _ in items])
    model = common.load_classifier(base_dir, list(LABELS))
    log = lambda step, loss: print(f"step {step} loss {loss:.4f}", flush=True)  # noqa: E731
    with common.timed() as t_train:
        res = common.train(model, exs, epochs=hp["epochs"], batch_size=hp["batch_size"], lr=hp["lr"],
                           weight_decay=hp["weight_decay"], warmup_ratio=hp["warmup_ratio"], seed=cfg["seed"],
                           max_steps=max_steps, log_every=hp.get("log_every", 50), on_log=log,
                           freeze_layers=hp.get("freeze_layers", 0), max_seconds=hp.get("max_seconds"),
                           loss=nli_or_grounding_loss if any(it[2] == NOT_SUPPORTED for it in items) else None)
    metrics: dict[str, Any] = {
        "model": "explainer", "labels": list(LABELS), "seed": cfg["seed"], "max_length": cfg["max_length"],
        "train": {"examples": len(exs), "steps": res.steps, "planned_steps": res.planned_steps,
                  "stopped_early": res.stopped_early, "examples_seen": min(len(exs), res.steps * hp["batch_size"]),
                  "seconds": t_train["seconds"], "loss_curve": res.losses,
                  "per_source": {s: sum(1 for it in items if it[3] == s) for s in sorted({it[3] for it in items})},
                  "per_class": np.bincount([it[2] for it in items], minlength=3).tolist()},  # [3] = not supported
        "machine": common.machine_info(),
    }
    if splits["test"]:
        with common.timed() as t_eval:
            probs = predict(model, tok, splits["test"])
        metrics["test"] = report(splits["test"], probs, cfg["data"].get("two_way", []))
        metrics["test"]["seconds"] = t_eval["seconds"]
        three_way = [i for i, it in enumerate(splits["test"]) if it[3] not in cfg["data"].get("two_way", [])]
        metrics["nli_entailment"] = entailment_threshold(
            [splits["test"][i] for i in three_way], probs[three_way], cfg.get("entailment_precision", 0.9))
    work = out_dir / "work" / "hf"
    model.save_pretrained(str(work))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (base_dir / name).is_file():
            (work / name).write_bytes((base_dir / name).read_bytes())
    return metrics


def export(cfg: dict[str, Any], out_dir: Path, metrics: dict[str, Any],
           config_path: str = "models/explainer/train.yaml") -> dict[str, Any]:
    with common.timed() as t_export:
        parity = export_classifier(
            out_dir / "work" / "hf", "explainer", out_dir, list(LABELS), cfg["max_length"],
            threshold=(metrics.get("nli_entailment") or {}).get("threshold"),
            provenance={"base_model": common.BASE_MODEL_NAME, "seed": cfg["seed"], "config": config_path})
    return {"seconds": t_export["seconds"], **{k: v for k, v in parity.items() if "diff" in k or k == "ok"}}


def evaluate_served(out_dir: Path, cfg: dict[str, Any], items: Sequence[Item], metrics: dict[str, Any]) -> None:
    """Held-out metrics from the exported int8 graph through the serving Explainer (what users get).

    Probabilities per pair are the per-class max over premise windows (one window for almost
    every pair at max_length 128); the label is the Explainer's own window aggregation.
    """
    from extproc.inference.models import Explainer, OnnxModel
    from extproc.inference.runtime import RuntimeOptions

    explainer = Explainer(OnnxModel(out_dir, "explainer", RuntimeOptions(provider="cpu", intra_op_threads=1)))
    probs = np.zeros((len(items), len(LABELS)), dtype=np.float32)
    for i, (p, h, _, _) in enumerate(items):
        prem, hyp = nli_input(p, h)
        prepared = explainer.prepare([prem], [hyp])
        rows = explainer.model.infer(prepared[0].rows)
        probs[i] = np.max(np.stack(rows), axis=0)
    if "test" in metrics and "test_torch_fp32" not in metrics:
        metrics["test_torch_fp32"] = metrics.pop("test")
        metrics["nli_entailment_torch_fp32"] = metrics.pop("nli_entailment", None)
    two_way = cfg["data"].get("two_way", [])
    metrics["test"] = report(items, probs, two_way)
    metrics["test"]["graph"] = "int8 ONNX via extproc.inference.Explainer"
    three = [i for i, it in enumerate(items) if it[3] not in two_way]
    metrics["nli_entailment"] = entailment_threshold([items[i] for i in three], probs[three],
                                                     cfg.get("entailment_precision", 0.9))
    set_recommended_threshold(out_dir, metrics["nli_entailment"]["threshold"])


def main(argv: Sequence[str] | None = None) -> int:
    ap = common.classifier_cli(__doc__.splitlines()[0], "explainer", common.SHARED_DATA / "nli")
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
        metrics["export"] = export(cfg, out, metrics, Path(args.config).as_posix())
    if cfg.get("notes"):  # the config's own account of what changed, rendered into the card
        metrics["notes"] = list(cfg["notes"])
    metrics["model_bytes"] = common.dir_size_bytes(out) - common.dir_size_bytes(out / "work")
    if splits["test"]:
        evaluate_served(out, cfg, splits["test"], metrics)
    common.write_json(out / "metrics.json", metrics)
    test = metrics.get("test", {})
    print(f"test accuracy {test.get('accuracy')} per source "
          f"{ {k: v['accuracy'] for k, v in test.get('per_source', {}).items()} } "
          f"train {metrics['train']['seconds']}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
