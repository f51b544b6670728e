"""Sentinel data: prompt sources (one loader per public dataset under ../shared/data/prompts) and the splits.

Each loader yields plain prompt strings; the label and the train/dev assignment come from
`models/sentinel/train.yaml`, so the data mix is changed in config, not code.
Labels: 0 = non_factual (code, math, creative, roleplay, chit-chat, opinion), 1 = factual.
Dev sets are whole held-out datasets (listed in the config), so dev accuracy measures
generalisation to unseen phrasing and sources, not memorised templates.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from pathlib import Path
from typing import Any, Callable, Iterator

Loader = Callable[[Path], Iterator[str]]
LABELS = ["non_factual", "factual"]
Item = tuple[str, int, str]  # (prompt, label, source)


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _json(path: Path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _tsv(path: Path, header: bool = True) -> Iterator[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        rows = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        if header:
            next(rows, None)
        yield from rows


def nq_open(d: Path) -> Iterator[str]:
    for name in ("NQ-open.dev.jsonl", "NQ-open.efficientqa.dev.1.1.jsonl",
                 "NQ-open.efficientqa.test.1.1.no-annotations.jsonl"):
        for row in _jsonl(d / "nq_open" / name):
            yield row["question"]


def webquestions(d: Path) -> Iterator[str]:
    for name in ("trainmodel.json", "val.json", "devtest.json", "test.json"):
        for row in _json(d / "webquestions" / name):
            yield row["qText"]


def freebaseqa(d: Path) -> Iterator[str]:
    # 'question | answer', but a few rows are swapped: the question is the longer side.
    for name in ("FreebaseQA-dev.txt", "FreebaseQA-eval.txt"):
        with open(d / "freebaseqa" / name, encoding="utf-8") as fh:
            for line in fh:
                parts = [p.strip() for p in line.split(" | ")]
                if parts and parts[0]:
                    yield max(parts, key=lambda p: len(p.split()))


def factoid_curated(d: Path) -> Iterator[str]:
    for name in ("curated-full.tsv", "large2470-train.tsv", "large2470-test.tsv"):
        for row in _tsv(d / "factoid_curated" / name, header=False):
            if len(row) >= 3:
                yield row[2]


def _selfaware(d: Path, answerable: bool) -> Iterator[str]:
    for ex in _json(d / "selfaware" / "SelfAware.json")["example"]:
        if bool(ex["answerable"]) == answerable:
            yield ex["question"]


def selfaware_answerable(d: Path) -> Iterator[str]:
    return _selfaware(d, True)


def selfaware_unanswerable(d: Path) -> Iterator[str]:
    return _selfaware(d, False)


def mintaka(d: Path) -> Iterator[str]:
    for row in _json(d / "mintaka" / "mintaka_dev.json"):
        yield row["question"]


def truthfulqa(d: Path) -> Iterator[str]:
    with open(d / "truthfulqa" / "TruthfulQA.csv", encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            yield row["Question"]


def hotpotqa_sciq(d: Path) -> Iterator[str]:
    for name in ("kilt_tasks_hotpotqa_straighforward_qa.jsonl", "sciq_Direct_Question_Closed_Book_.jsonl"):
        for row in _jsonl(d / "self_instruct" / name):
            text = row["prompt"].strip()
            if text.startswith("Q:"):
                text = text[2:].rsplit("A:", 1)[0].strip()
            yield text


def _bench(d: Path, folder: str, categories: set[str]) -> Iterator[str]:
    for row in _jsonl(d / folder / "question.jsonl"):
        if row["category"] in categories:
            yield row["turns"][0]


MT_FACTUAL = {"stem", "humanities"}
VICUNA_FACTUAL = {"knowledge"}


def mtbench_vicuna_factual(d: Path) -> Iterator[str]:
    yield from _bench(d, "mt_bench", MT_FACTUAL)
    yield from _bench(d, "vicuna_bench", VICUNA_FACTUAL)


def mtbench_vicuna_nonfactual(d: Path) -> Iterator[str]:
    yield from _bench(d, "mt_bench", {"writing", "roleplay", "math", "coding", "reasoning", "extraction"})
    yield from _bench(d, "vicuna_bench", {"roleplay", "fermi", "counterfactual", "writing", "coding", "math"})


def hellobench(d: Path, name: str) -> Iterator[str]:
    for row in _jsonl(d / "hellobench" / f"{name}.jsonl"):
        yield row.get("raw_text") or row["instruction"]


def hellobench_open_qa(d: Path) -> Iterator[str]:
    for row in _jsonl(d / "hellobench" / "open_ended_qa.jsonl"):
        if row["category"] != "write":
            yield row.get("raw_text") or row["instruction"]


def hellobench_creative(d: Path) -> Iterator[str]:
    yield from hellobench(d, "heuristic_text_generation")
    yield from hellobench(d, "text_completion")


def hellobench_chat(d: Path) -> Iterator[str]:
    return hellobench(d, "chat")


def gsm8k(d: Path) -> Iterator[str]:
    for name in ("train.jsonl", "test.jsonl"):
        for row in _jsonl(d / "gsm8k" / name):
            yield row["question"]


def _instructions(path: Path) -> Iterator[str]:
    for row in _json(path):
        inp = (row.get("input") or "").strip()
        yield row["instruction"] + ("\n" + inp if inp else "")


def codealpaca(d: Path) -> Iterator[str]:
    return _instructions(d / "codealpaca" / "code_alpaca_2k.json")


def gpteacher_code(d: Path) -> Iterator[str]:
    return _instructions(d / "gpteacher" / "codegen-instruct.json")


def gpteacher_roleplay(d: Path) -> Iterator[str]:
    return _instructions(d / "gpteacher" / "roleplay-simple-deduped-roleplay-instruct.json")


def human_eval(d: Path) -> Iterator[str]:
    for row in _jsonl(d / "human_eval" / "HumanEval.jsonl.gz"):
        yield row["prompt"]


def mbppplus(d: Path) -> Iterator[str]:
    yield from _json(d / "mbppplus" / "mbppplus.json").values()


def awesome_chatgpt(d: Path) -> Iterator[str]:
    with open(d / "awesome_chatgpt_prompts" / "prompts.csv", encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            yield row["prompt"]


def chitchat(d: Path) -> Iterator[str]:
    for persona in ("friend", "professional", "comic"):
        for row in _tsv(d / "chitchat_personality" / f"qna_chitchat_the_{persona}.tsv"):
            if row:
                yield row[0]


def _arena(d: Path, version: str, keep: Callable[[dict], bool]) -> Iterator[str]:
    for row in _jsonl(d / "arena_hard" / version / "question.jsonl"):
        if keep(row):
            yield row["prompt"]


def arena_v01(d: Path) -> Iterator[str]:
    return _arena(d, "v0.1", lambda r: True)


def arena_v2_hard(d: Path) -> Iterator[str]:
    return _arena(d, "v2.0", lambda r: r["category"] == "hard_prompt")


def arena_v2_creative(d: Path) -> Iterator[str]:
    return _arena(d, "v2.0", lambda r: r["category"] == "creative_writing")


def _subjqa(d: Path, domains: tuple[str, ...]) -> Iterator[str]:
    # README: level 1 = most subjective; levels 1-2 are opinion-seeking questions.
    for domain in domains:
        for split in sorted((d / "subjqa" / domain).glob("*.csv")):
            with open(split, encoding="utf-8", newline="") as fh:
                for row in csv.DictReader(fh):
                    if row["question_subj_level"] in ("1", "2"):
                        yield row["question"]


def subjqa_a(d: Path) -> Iterator[str]:
    return _subjqa(d, ("books", "electronics", "grocery", "movies"))


def subjqa_b(d: Path) -> Iterator[str]:
    return _subjqa(d, ("restaurants", "tripadvisor"))


LOADERS: dict[str, Loader] = {
    fn.__name__: fn
    for fn in (
        nq_open, webquestions, freebaseqa, factoid_curated, selfaware_answerable, selfaware_unanswerable,
        mintaka, truthfulqa, hotpotqa_sciq, mtbench_vicuna_factual, mtbench_vicuna_nonfactual,
        hellobench_open_qa, hellobench_creative, hellobench_chat, gsm8k, codealpaca, gpteacher_code,
        gpteacher_roleplay, human_eval, mbppplus, awesome_chatgpt, chitchat, arena_v01, arena_v2_hard,
        arena_v2_creative, subjqa_a, subjqa_b,
    )
}


def load_source(name: str, data_dir: Path) -> list[str]:
    """Distinct, stripped, non-empty prompts of one source (first occurrence kept)."""
    if name not in LOADERS:
        raise KeyError(f"unknown sentinel source {name!r}; known: {sorted(LOADERS)}")
    seen: set[str] = set()
    out = []
    for text in LOADERS[name](data_dir):
        text = (text or "").strip()
        key = " ".join(text.lower().split())
        if text and key not in seen:
            seen.add(key)
            out.append(text)
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def augment_question(text: str, rng: random.Random, p_add: float, p_strip: float) -> str:
    """Decorrelate '?' from the label: NQ queries have none, most other questions do."""
    stripped = text.rstrip()
    if stripped.endswith("?"):
        return stripped.rstrip("?").rstrip() if rng.random() < p_strip else stripped
    return stripped + "?" if rng.random() < p_add else stripped


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
