"""Train, evaluate and export the explainer: 3-way NLI over (premise, hypothesis).

    python -m models.pipelines.explainer.train --config models/explainer/train.yaml --out models/explainer
    python -m models.pipelines.explainer.train --config models/verifier/train.yaml --out models/verifier

Labels: entailment, neutral, contradiction (the gateway drops a flagged span when the
context entails the sentence holding it). Accuracy is reported per held-out source.
A config with `data.grounding` also trains on answer sentences against their context window
(`data.py`), with the loss on P(entailment) alone for unsupported sentences:
that model is the grounding verifier.
`init_from:` (a path, relative to the repository root) starts from that Hugging Face checkpoint instead of
the base encoder, its head included: e.g. a finished explainer run's <out>/work/hf, so the verifier is an
NLI model fine-tuned further (models/verifier/train.yaml). `--base` still overrides it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from extproc.inference.templates import nli_pair
from models import shared
from models.pipelines.explainer.data import LABELS, NOT_SUPPORTED, Item, build_splits
from models.pipelines.explainer.evaluate import entailment_threshold, predict, report
from models.pipelines.explainer.export import evaluate_served, export


def nli_or_grounding_loss(logits, labels):  # type: ignore[no-untyped-def]
    """Cross-entropy for NLI labels; -log(1 - P(entailment)) for NOT_SUPPORTED sentences."""
    import torch

    logp = torch.log_softmax(logits, dim=-1)
    nli = labels < NOT_SUPPORTED
    ce = -logp[nli].gather(1, labels[nli][:, None])[:, 0]
    not_entailed = -torch.logsumexp(logp[~nli][:, 1:], dim=1)
    return torch.cat([ce, not_entailed]).mean()


def run(cfg: dict[str, Any], splits: dict[str, list[Item]], out_dir: Path, base_dir: Path,
        max_steps: int | None = None) -> dict[str, Any]:
    shared.set_seed(cfg["seed"])
    shared.set_threads(cfg.get("threads"))
    hp = cfg["train"]
    tok = shared.load_tokenizer(base_dir, cfg["max_length"])
    items = splits["train"]
    exs = shared.encode(tok, [nli_pair(p, h) for p, h, _, _ in items], [y for _, _, y, _ in items])
    model = shared.load_classifier(base_dir, list(LABELS))
    log = lambda step, loss: print(f"step {step} loss {loss:.4f}", flush=True)  # noqa: E731
    with shared.timed() as t_train:
        res = shared.train(model, exs, epochs=hp["epochs"], batch_size=hp["batch_size"], lr=hp["lr"],
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
        "machine": shared.machine_info(),
    }
    if splits["test"]:
        with shared.timed() as t_eval:
            probs = predict(model, tok, splits["test"])
        metrics["test"] = report(splits["test"], probs, cfg["data"].get("two_way", []))
        metrics["test"]["seconds"] = t_eval["seconds"]
        three_way = [i for i, it in enumerate(splits["test"]) if it[3] not in cfg["data"].get("two_way", [])]
        metrics["nli_entailment"] = entailment_threshold(
            [splits["test"][i] for i in three_way], probs[three_way], cfg.get("entailment_precision", 0.9))
    shared.save_checkpoint(model, base_dir, out_dir / "work" / "hf")
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    ap = shared.classifier_cli(__doc__.splitlines()[0], "explainer", shared.SHARED_DATA / "nli")
    args = ap.parse_args(argv)
    cfg = shared.load_yaml(args.config)
    base = Path(args.base) if args.base else (
        shared.REPO_ROOT / cfg["init_from"] if cfg.get("init_from") else shared.base_model_dir(cfg.get("base_model")))
    out = Path(args.out)
    splits = build_splits(cfg, Path(args.data))
    print({k: len(v) for k, v in splits.items()}, flush=True)
    metrics = shared.load_or_train(args, out, lambda: run(cfg, splits, out, base, max_steps=args.max_steps))
    if not args.eval_only:
        metrics["export"] = export(cfg, out, metrics, Path(args.config).as_posix())
    shared.add_card_facts(cfg, out, metrics)
    if splits["test"]:
        evaluate_served(out, cfg, splits["test"], metrics)
    shared.write_json(out / "metrics.json", metrics)
    test = metrics.get("test", {})
    print(f"test accuracy {test.get('accuracy')} per source "
          f"{ {k: v['accuracy'] for k, v in test.get('per_source', {}).items()} } "
          f"train {metrics['train']['seconds']}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
