"""Train the sentinel's lexical prefilter and measure the cascade on the sentinel's dev sources.

    python -m models.pipelines.sentinel.prefilter --config models/sentinel/train.yaml --model models/sentinel

Same data and splits as the sentinel (whole held-out dev sources). The model is a logistic
regression over word n-gram features (extproc/inference/prefilter.py) seen at least `min_count`
times in training, fitted with Adagrad in numpy in seconds. Its confidence band is fixed in the config, not tuned on dev;
5-fold cross-validation on the training prompts reports the in-distribution precision at
the band, and dev reports what the cascade (prefilter when confident, else the served
int8 sentinel at its recommended threshold) does on sources it never saw.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from extproc.inference.prefilter import LexicalPrefilter, PrefilterBand, feature_indices, feature_keys
from models import shared
from models.pipelines.sentinel.data import build_splits


def vocabulary(texts: Sequence[str], min_count: int) -> list[str]:
    """Features seen in at least `min_count` training prompts, sorted (their index is their position)."""
    counts = Counter(k for t in texts for k in feature_keys(t))
    return sorted(k for k, c in counts.items() if c >= min_count)


def fit(features: Sequence[np.ndarray], y: np.ndarray, dims: int, epochs: int, lr: float, l2: float,
        seed: int) -> tuple[np.ndarray, float]:
    """Class-weighted logistic regression, sparse Adagrad (one pass per epoch, shuffled)."""
    w = np.zeros(dims)
    g2 = np.full(dims, 1e-8)
    b, gb2 = 0.0, 1e-8
    counts = np.bincount(y.astype(int), minlength=2)
    cw = counts.sum() / (2 * np.maximum(counts, 1))
    rng = np.random.default_rng(seed)
    order = np.arange(len(features))
    for _ in range(epochs):
        rng.shuffle(order)
        for i in order:
            f = features[i]
            p = 1.0 / (1.0 + np.exp(-(w[f].sum() + b)))
            g = (p - y[i]) * cw[int(y[i])]
            gw = g + l2 * w[f]
            g2[f] += gw * gw
            w[f] -= lr * gw / np.sqrt(g2[f])
            gb2 += g * g
            b -= lr * g / np.sqrt(gb2)
    return w.astype(np.float32), float(b)


def _probs(w: np.ndarray, b: float, features: Sequence[np.ndarray]) -> np.ndarray:
    z = np.array([w[f].sum() + b for f in features])
    return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))


def band_report(p: np.ndarray, y: np.ndarray, band: PrefilterBand) -> dict[str, Any]:
    lo, hi = p <= band.non_factual_below, p >= band.factual_above
    conf = lo | hi
    correct = (lo & (y == 0)) | (hi & (y == 1))
    return {"n": int(len(y)), "coverage": round(float(conf.mean()), 4),
            "non_factual_coverage": round(float(lo.mean()), 4), "factual_coverage": round(float(hi.mean()), 4),
            "precision": round(float(correct.sum() / max(1, conf.sum())), 4)}


def featurize(texts: Sequence[str], vocab: Sequence[str]) -> list[np.ndarray]:
    index = {k: i for i, k in enumerate(vocab)}
    return [feature_indices(t, index) for t in texts]


def fit_texts_config(texts: Sequence[str], y: np.ndarray, pcfg: dict[str, Any], seed: int
                     ) -> tuple[list[str], np.ndarray, float]:
    """Vocabulary from these prompts, then the regression: (vocabulary, weights, bias)."""
    vocab = vocabulary(texts, pcfg["min_count"])
    w, b = fit(featurize(texts, vocab), y, len(vocab), pcfg["epochs"], pcfg["lr"], pcfg["l2"], seed)
    return vocab, w, b


def cross_validate(texts: Sequence[str], y: np.ndarray, pcfg: dict[str, Any], band: PrefilterBand,
                   seed: int, folds: int = 5) -> dict[str, Any]:
    """Out-of-fold probabilities, the vocabulary rebuilt inside each fold (as training would)."""
    fold = np.random.default_rng(seed).integers(0, folds, len(texts))
    oof = np.zeros(len(texts))
    for k in range(folds):
        train = fold != k
        fit_texts = [t for t, m in zip(texts, train) if m]
        vocab, w, b = fit_texts_config(fit_texts, y[train], pcfg, seed)
        oof[~train] = _probs(w, b, featurize([t for t, m in zip(texts, train) if not m], vocab))
    return {"folds": folds, "accuracy_at_0.5": round(float(np.mean((oof >= 0.5) == y)), 4), **band_report(oof, y, band)}


def cascade_report(items: Sequence[tuple[str, int, str]], p_lex: np.ndarray, p_model: np.ndarray,
                   threshold: float, band: PrefilterBand) -> dict[str, Any]:
    y = np.array([lab for _, lab, _ in items])
    model_pred = (p_model >= threshold).astype(int)
    pred = np.where(p_lex >= band.factual_above, 1, np.where(p_lex <= band.non_factual_below, 0, model_pred))
    per_source: dict[str, dict[str, Any]] = {}
    for s in sorted({s for _, _, s in items}):
        m = np.array([src == s for _, _, src in items])
        per_source[s] = {"n": int(m.sum()), "accuracy": round(float(np.mean(pred[m] == y[m])), 4),
                         "coverage": round(float(np.mean((p_lex[m] <= band.non_factual_below) | (p_lex[m] >= band.factual_above))), 4)}
    return {"accuracy": round(float(np.mean(pred == y)), 4),
            "model_only_accuracy": round(float(np.mean(model_pred == y)), 4),
            "prefilter_only_accuracy_at_0.5": round(float(np.mean((p_lex >= 0.5) == y)), 4),
            "band": band_report(p_lex, y, band), "per_source": per_source}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="models/sentinel/train.yaml")
    ap.add_argument("--model", default="models/sentinel", help="the exported sentinel directory (gets prefilter.npz)")
    ap.add_argument("--data", default=str(shared.SHARED_DATA / "prompts"))
    ap.add_argument("--no-cv", action="store_true", help="skip the 5-fold cross-validation report")
    args = ap.parse_args(argv)
    cfg = shared.load_yaml(args.config)
    pcfg = cfg["prefilter"]
    band = PrefilterBand(pcfg["non_factual_below"], pcfg["factual_above"])
    model_dir = Path(args.model)
    splits = build_splits(cfg, Path(args.data))
    texts = [t for t, _, _ in splits["train"]]
    y_train = np.array([lab for _, lab, _ in splits["train"]], dtype=float)
    with shared.timed() as t_fit:
        vocab, w, b = fit_texts_config(texts, y_train, pcfg, cfg["seed"])
    report: dict[str, Any] = {"config": {k: pcfg[k] for k in sorted(pcfg)}, "train_prompts": len(texts),
                              "train_seconds": t_fit["seconds"], "features": len(vocab),
                              "nonzero_weights": int(np.count_nonzero(w))}
    if not args.no_cv:
        report["cross_validation"] = cross_validate(texts, y_train, pcfg, band, cfg["seed"])
    pre = LexicalPrefilter.from_vocabulary(vocab, w, b, band, {"seed": cfg["seed"], "config": args.config})
    pre.save(model_dir)
    if splits["dev"]:
        from extproc.inference.models import OnnxModel, Sentinel
        from extproc.inference.runtime import RuntimeOptions

        metrics_path = model_dir / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
        sentinel = Sentinel(OnnxModel(model_dir, "sentinel", RuntimeOptions(provider="cpu", intra_op_threads=1)))
        dev = splits["dev"]
        p_model = np.array(sentinel.predict_batch([t for t, _, _ in dev]))
        served = LexicalPrefilter.load(model_dir)  # as the gateway scores: the saved fp16 weights
        p_lex = np.array([served.probability(t) for t, _, _ in dev])
        threshold = float(metrics.get("threshold", 0.5))
        report["dev"] = cascade_report(dev, p_lex, p_model, threshold, band)
        if metrics:
            metrics["prefilter"] = report
            shared.write_json(model_dir / "metrics.json", metrics)
        print(f"prefilter: dev cascade accuracy {report['dev']['accuracy']} (model alone "
              f"{report['dev']['model_only_accuracy']}), decided without the model "
              f"{report['dev']['band']['coverage']:.1%}, precision there {report['dev']['band']['precision']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
