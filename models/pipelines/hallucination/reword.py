"""Meaning-preserving rewrites of grounded text, so synthetic faithful answers are not verbatim.

An LLM answering over retrieved passages rewords them: it drops asides, writes numbers and dates
its own way, swaps a word for a synonym, turns passives around. A detector trained only on
answers that copy the context learns "not copied = unsupported" and flags those rewordings.
Every rewrite here keeps the claims of the text (or drops some, which keeps it supported), so
the result stays faithful; the synthetic set then perturbs the reworded text, and only the
perturbation is labelled. Used by `models.pipelines.hallucination.synthetic --p-reword`; the bundled detector's recipe
leaves it off (it did not help on rewordings written by hand, see models/detector/README.md).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Callable

_NUM_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
              "eleven", "twelve"]
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"

# Context-free in encyclopaedic text: either word states the same fact (synonyms.json beside this file).
SYNONYMS: dict[str, list[str]] = json.loads(Path(__file__).with_name("synonyms.json").read_text(encoding="utf-8"))
_SYN = re.compile(r"\b(" + "|".join(sorted(map(re.escape, SYNONYMS), key=len, reverse=True)) + r")\b")

_PASSIVE = re.compile(
    r"^(?P<x>[A-Z][^,;]{2,60}?) (?:was|were) (?P<v>directed|written|founded|created|produced|designed|"
    r"developed|composed|published|built|formed|discovered) by (?P<y>[A-Z][^,;.]{1,50}?)(?P<end>[,;.]|$)")
_ACTIVE = {"written": "wrote"}
_PAREN = re.compile(r"\s*\([^()]{1,120}\)")
_DATE_MDY = re.compile(r"\b(" + _MONTHS + r") (\d{1,2}), (\d{4})\b")
_DATE_DMY = re.compile(r"\b(\d{1,2}) (" + _MONTHS + r") (\d{4})\b")
_SMALL = re.compile(r"(?<![#$£€.,\d-])\b([1-9]|1[0-2]) (?=[a-z]{3,})")
_WORDNUM = re.compile(r"\b(" + "|".join(_NUM_WORDS[2:]) + r") (?=[a-z]{3,})")
_THOUSANDS = re.compile(r"\b(\d{1,3}),(\d{3})\b")
_WHICH = re.compile(r", which (is|was|has|had) ")


def _synonym(text: str, rng: random.Random) -> str:
    hits = list(_SYN.finditer(text))
    if not hits:
        return text
    m = rng.choice(hits)
    return text[:m.start()] + rng.choice(SYNONYMS[m.group(0)]) + text[m.end():]


def _active(text: str, rng: random.Random) -> str:
    def turn(m: re.Match[str]) -> str:
        x = m.group("x")
        x = x[0].lower() + x[1:] if x.split()[0] in ("The", "A", "An") else x
        return f"{m.group('y')} {_ACTIVE.get(m.group('v'), m.group('v'))} {x}{m.group('end')}"
    return _PASSIVE.sub(turn, text, count=1)


def _drop_parens(text: str, rng: random.Random) -> str:
    return _PAREN.sub("", text)


def _dates(text: str, rng: random.Random) -> str:
    if _DATE_MDY.search(text):
        return _DATE_MDY.sub(r"\2 \1 \3", text)
    return _DATE_DMY.sub(r"\2 \1, \3", text)


def _numbers(text: str, rng: random.Random) -> str:
    if _THOUSANDS.search(text):
        return _THOUSANDS.sub(r"\1\2", text)
    if _SMALL.search(text):
        return _SMALL.sub(lambda m: _NUM_WORDS[int(m.group(1))] + " ", text, count=1)
    return _WORDNUM.sub(lambda m: f"{_NUM_WORDS.index(m.group(1))} ", text, count=1)


def _split_which(text: str, rng: random.Random) -> str:
    return _WHICH.sub(lambda m: f". It {m.group(1)} ", text, count=1)


REWRITES: list[Callable[[str, random.Random], str]] = [
    _synonym, _synonym, _active, _drop_parens, _dates, _numbers, _split_which,
]


def reword(text: str, rng: random.Random, max_rewrites: int = 3) -> str:
    """Apply up to `max_rewrites` randomly chosen rewrites; the claims stay those of `text`."""
    ops = rng.sample(REWRITES, k=min(len(REWRITES), rng.randint(1, max_rewrites)))
    for op in ops:
        text = op(text, rng)
    return re.sub(r"\s{2,}", " ", text).strip()
