"""Detector data: the converted span-labelled sets (models/pipelines/hallucination), sampled into
training rows and dev records.

`ensure_data` builds a missing converted file on demand (fresh checkout, `make models`); training
rows come from `features.training_example`, the serving template and windowing.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Sequence

from models import shared
from models.pipelines.detector.features import Featurizer, training_example
from models.pipelines.hallucination.records import read_jsonl

DATA_DIR = shared.HALLUCINATION_CACHE


def ensure_data(data_dir: Path, sources: Sequence[str]) -> None:
    """Build the converted sets when a needed file is missing (fresh checkout, `make models`)."""
    need = [s for s in sources if not (data_dir / f"{s}.train.jsonl").is_file()]
    if not need:
        return
    from models.pipelines.hallucination import convert, synthetic

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


def build_train(cfg: dict[str, Any], feat: Featurizer, data_dir: Path, rng: random.Random) -> list[shared.Example]:
    """Training rows per source; a source with longer contexts may get longer rows
    (`train_max_length_by_source`) so its evidence is not windowed away."""
    exs = []
    longer = cfg.get("train_max_length_by_source") or {}
    for src, n in cfg["train_mix"].items():
        length = int(longer.get(src, cfg["train_max_length"]))
        for rec in sample(data_dir / f"{src}.train.jsonl", n, rng):
            exs.append(training_example(feat, rec, length))
    return exs


def dev_sets(cfg: dict[str, Any], data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    return {src: sample(data_dir / f"{src}.dev.jsonl", n, random.Random(cfg.get("dev_seed", cfg["seed"])))
            for src, n in cfg["dev_limit"].items()}
