"""Synthetic RAG-QA answers with exactly known hallucinated spans, built from HaluEval QA.

The target traffic is an LLM answer over retrieved passages that is mostly grounded but
carries a short unsupported addition or a swapped fact. HaluEval's own answers are either a
bare entity (faithful) or a whole wrong sentence, so a detector trained only on them learns
"long answer = hallucinated". Here every answer copies grounded sentences from the knowledge
and then, for most records, either
  * swaps one entity / number / date / month in the copied text (a contradiction), or
  * inserts an unsupported sentence or clause (a baseless addition): HaluEval's ChatGPT-written
    wrong answer, a sentence from an unrelated record, or a templated claim about an entity
    of this passage,
labelling exactly the changed characters. With `--p-reword P`, that share of answers has its
grounded text reworded first (reword.py: synonyms, dates and numbers written another
way, asides dropped, passives turned), as an LLM would; the bundled detector's recipe leaves it
at 0 (tried, not shipped: see models/detector/README.md). Distractor passages from other records make the
context look like retrieval output (several passages, only one relevant).

    python -m models.pipelines.hallucination.synthetic --out data-cache/hallucination [--n-train 6000]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Iterator

from models import shared
from models.pipelines.hallucination.convert import DEFAULT_DATA
from models.pipelines.hallucination.records import Record, digest, make_record, split_of, write_jsonl
from models.pipelines.hallucination.reword import reword

SENT_SPLIT = re.compile(r"(?<=[.!?])\s*(?=[A-Z\"(])")
NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
MONTH = re.compile(r"\b(" + "|".join(MONTHS) + r")\b")
ENTITY = re.compile(r"\b[A-Z][a-zA-Z'\-]+(?: (?:of |the |de )?[A-Z][a-zA-Z'\-]+)*")
STOP_CAPS = {"The", "A", "An", "It", "He", "She", "They", "This", "In", "On", "At", "His", "Her",
             "Its", "Their", "As", "After", "During", "Both", "However", "Although"} | set(MONTHS)

# answer leads, answer-first openings, inserted claims and inline clauses ({E} entity, {E2} another,
# {P} place, {Y} year, {N} number, {M} month): synthetic_templates.json beside this file
_TEMPLATES = json.loads(Path(__file__).with_name("synthetic_templates.json").read_text(encoding="utf-8"))
LEADS: list[str] = _TEMPLATES["leads"]
ANSWER_FIRST: list[str] = _TEMPLATES["answer_first"]
CLAUSES: list[str] = _TEMPLATES["clauses"]
INLINE: list[str] = _TEMPLATES["inline"]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENT_SPLIT.split(text) if len(s.strip()) > 3]


def entities(text: str) -> list[str]:
    out = []
    for m in ENTITY.finditer(text):
        ent = m.group(0)
        words = ent.split()
        if words[0] in STOP_CAPS:
            ent = " ".join(words[1:])
        if len(ent) > 2 and ent not in STOP_CAPS:
            out.append(ent)
    return out


def _support(knowledge: str, question: str, answer: str) -> list[str]:
    sents = sentences(knowledge) or [knowledge.strip()]
    low = answer.lower()
    hits = [s for s in sents if low and low in s.lower()]
    if hits:
        return hits[:2]
    q = set(re.findall(r"\w+", (question + " " + answer).lower()))
    return sorted(sents, key=lambda s: -len(q & set(re.findall(r"\w+", s.lower()))))[:2]


def _new_number(tok: str, rng: random.Random) -> str:
    digits = tok.replace(",", "")
    try:
        val = float(digits)
    except ValueError:
        return tok
    if "." in digits:
        return f"{val * rng.choice([0.5, 1.5, 2, 3]):.{len(digits.split('.')[1])}f}"
    v = int(val)
    if 1000 <= v <= 2100:  # a year: plausible neighbour
        new = v + rng.choice([-1, 1]) * rng.randint(1, 15)
    elif v < 10:
        new = rng.choice([x for x in range(1, 13) if x != v])
    else:
        new = max(1, int(v * rng.choice([0.3, 0.5, 1.5, 2, 3]) + rng.randint(1, 9)))
    s = str(new)
    return f"{new:,}" if "," in tok else s


def swap(answer: str, start: int, knowledge: str, pool: list[str], rng: random.Random
         ) -> tuple[str, tuple[int, int]] | None:
    """Replace one number, month or entity at or after `start`; None if nothing swappable."""
    region = answer[start:]
    cands = [("num", m) for m in NUMBER.finditer(region)] + [("month", m) for m in MONTH.finditer(region)]
    cands += [("ent", m) for m in ENTITY.finditer(region)
              if m.group(0).split()[0] not in STOP_CAPS and m.start() > 0]
    rng.shuffle(cands)
    low_k = knowledge.lower()
    for kind, m in cands:
        old = m.group(0)
        if kind == "num":
            new = _new_number(old, rng)
        elif kind == "month":
            new = rng.choice([x for x in MONTHS if x != old])
        else:
            same = [e for e in pool if len(e.split()) == len(old.split()) and e.lower() not in low_k]
            new = rng.choice(same) if same else None
        if not new or new == old or new.lower() in low_k:
            continue
        s = start + m.start()
        return answer[:s] + new + answer[s + len(old):], (s, s + len(new))
    return None


def cross_swap(answer: str, start: int, knowledge: str, others: str, rng: random.Random
               ) -> tuple[str, tuple[int, int]] | None:
    """Replace one number, month or entity at or after `start` with one of the same kind that a distractor
    passage (`others`) holds and the answer's own passage does not: a fact mixed in from the wrong passage, the
    error small RAG writers make most (models/data/real_rag). The new text is in the context, so a detector
    that only asks "is this token in the context?" cannot see it; None if nothing swappable."""
    region = answer[start:]
    low_k = knowledge.lower()
    options = {
        "num": [m.group(0) for m in NUMBER.finditer(others)],
        "month": [m.group(0) for m in MONTH.finditer(others)],
        "ent": [e for e in entities(others) if e.split()[0] not in STOP_CAPS],
    }
    cands = [("num", m) for m in NUMBER.finditer(region)] + [("month", m) for m in MONTH.finditer(region)]
    cands += [("ent", m) for m in ENTITY.finditer(region)
              if m.group(0).split()[0] not in STOP_CAPS and m.start() > 0]
    rng.shuffle(cands)
    for kind, m in cands:
        old = m.group(0)
        same = [o for o in options[kind] if o != old and o.lower() not in low_k
                and (kind != "ent" or len(o.split()) == len(old.split()))]
        if not same:
            continue
        new = rng.choice(same)
        s = start + m.start()
        return answer[:s] + new + answer[s + len(old):], (s, s + len(new))
    return None


def _fill(tpl: str, ents: list[str], pool: list[str], rng: random.Random) -> str:
    return tpl.format(
        E=rng.choice(ents) if ents else "It", E2=rng.choice(pool), P=rng.choice(pool),
        Y=rng.randint(1890, 2022), N=rng.choice([12, 40, 150, 300, 2500, 12000]), M=rng.choice(MONTHS))


def addition(answer: str, ents: list[str], record: dict, other: dict, pool: list[str],
             rng: random.Random) -> tuple[str, tuple[int, int]]:
    """Insert an unsupported sentence (end or between sentences) or an inline clause."""
    choice = rng.random()
    if choice < 0.2 and ents:
        ent = rng.choice(ents)
        pos = answer.find(ent)
        if pos >= 0:
            clause = _fill(rng.choice(INLINE), ents, pool, rng)
            at = pos + len(ent)
            lead = len(clause) - len(clause.lstrip(" ,("))
            core = clause.strip(" ,()")
            new = answer[:at] + clause + answer[at:]
            return new, (at + lead, at + lead + len(core))
    if choice < 0.55:
        extra = record["hallucinated_answer"].strip()
    elif choice < 0.7:
        extra = rng.choice(sentences(other["knowledge"]) or [other["knowledge"]]).strip()
    else:
        extra = _fill(rng.choice(CLAUSES), ents, pool, rng)
    if extra and extra[-1] not in ".!?":
        extra += "."
    bounds = [m.end() for m in re.finditer(r"[.!?](?=\s)", answer)]
    if bounds and rng.random() < 0.4:
        at = rng.choice(bounds)
        new = answer[:at] + " " + extra + answer[at:]
        return new, (at + 1, at + 1 + len(extra))
    sep = "" if answer.endswith(" ") else " "
    new = answer + sep + extra
    return new, (len(answer) + len(sep), len(new))


def build(rows: list[dict], split: str, seed: int, p_faithful: float = 0.35, p_swap: float = 0.3,
          max_distractors: int = 2, p_reword: float = 0.0, p_mix: float = 0.0) -> Iterator[Record]:
    """`p_mix`: that share of the perturbed answers with distractors swaps in a fact from a distractor passage
    instead (`cross_swap`; its own random stream, so p_mix 0 writes exactly the records it always did)."""
    rng = random.Random(f"{seed}:{split}")
    mix_rng = random.Random(f"{seed}:{split}:mix")
    pool = [e for r in rows[:3000] for e in entities(r["knowledge"])]
    for i, r in enumerate(rows):
        support = _support(r["knowledge"], r["question"], r["right_answer"])
        lead = rng.choice(LEADS)
        body = " ".join(support[: rng.choice([1, 1, 2])])
        if p_reword and rng.random() < p_reword:
            body = reword(body, rng)
        if lead and body:
            body = body[0].lower() + body[1:] if not body[:2].isupper() and body.split()[0] in STOP_CAPS else body
        prefix = rng.choice(ANSWER_FIRST).format(a=r["right_answer"].strip().rstrip("."))
        answer = clean = prefix + lead + body
        grounded_from = len(prefix)
        spans: list[tuple[int, int]] = []
        roll = rng.random()
        kind = "faithful"
        if roll >= p_faithful:
            swapped = swap(answer, grounded_from, r["knowledge"], pool, rng) if roll < p_faithful + p_swap else None
            if swapped:
                answer, span = swapped
                kind = "swap"
            else:
                other = rows[rng.randrange(len(rows))]
                answer, span = addition(answer, entities(r["knowledge"]), r, other, pool, rng)
                kind = "addition"
            spans.append(span)
        passages = [r["knowledge"]]
        for _ in range(rng.randint(0, max_distractors)):
            passages.append(rows[rng.randrange(len(rows))]["knowledge"])
        rng.shuffle(passages)
        others = [p for p in passages if p != r["knowledge"]]
        if p_mix and kind != "faithful" and others and mix_rng.random() < p_mix:
            mixed = cross_swap(clean, grounded_from, r["knowledge"], "\n".join(others), mix_rng)
            if mixed:
                (answer, span), kind = mixed, "mix"
                spans = [span]
        rec = make_record(f"synthetic_qa-{split}-{i}-{kind}", passages, r["question"], answer, spans,
                          "qa", "synthetic_qa", digest(r["question"]))
        rec["perturbation"] = kind
        yield rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=shared.HALLUCINATION_CACHE)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--dev-fraction", type=float, default=0.1, help="must match convert.py's halueval_qa split")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--p-reword", type=float, default=0.0,
                    help="share of answers whose grounded text is reworded (reword.py) before perturbing")
    ap.add_argument("--p-mix", type=float, default=0.0,
                    help="share of perturbed answers (with distractors) that swap in a distractor passage's fact")
    args = ap.parse_args(argv)
    rows = {"train": [], "dev": []}
    with open(args.data / "halueval/eval_suite/dataset_halueval_qa.jsonl", encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if args.limit is not None and n >= args.limit:
                break
            r = json.loads(line)
            rows[split_of(digest(r["question"]), args.dev_fraction)].append(r)
    for split, part in rows.items():
        n = write_jsonl(args.out / f"synthetic_qa.{split}.jsonl", build(part, split, args.seed, p_reword=args.p_reword,
                                                                              p_mix=args.p_mix))
        print(f"synthetic_qa: {split} {n} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
