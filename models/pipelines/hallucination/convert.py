"""Turn the shared hallucination sets into span-labelled JSONL (see records.py for the format).

    python -m models.pipelines.hallucination.convert --out data-cache/hallucination [--sources faithbench xsum ...]

writes `<out>/<source>.train.jsonl` and `<out>/<source>.dev.jsonl`. The split hashes a
document/question id, so dev never shares a source text with train. Nothing here is
committed: the outputs are rebuilt from ../shared/data.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterator

from models import shared
from models.pipelines.hallucination.records import Record, digest, make_record, split_of, write_jsonl

DEFAULT_DATA = shared.SHARED_DATA / "hallucination"


def _whole(answer: str) -> list[tuple[int, int]]:
    """Span covering the answer without surrounding whitespace (response-level labels)."""
    start = len(answer) - len(answer.lstrip())
    end = len(answer.rstrip())
    return [(start, end)] if end > start else []


def _jsonl(path: Path, limit: int | None) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                return
            yield i, json.loads(line)


# ---------------------------------------------------------------- HaluEval (response-level, synthetic)


def halueval_qa(root: Path, limit: int | None = None) -> Iterator[Record]:
    """knowledge + question; right answer faithful, ChatGPT-written wrong answer one whole span."""
    for i, r in _jsonl(root / "halueval/eval_suite/dataset_halueval_qa.jsonl", limit):
        group = digest(r["question"])
        for kind, ans in (("right", r["right_answer"]), ("hal", r["hallucinated_answer"])):
            ans = ans.strip()
            if not ans:
                continue
            yield make_record(f"halueval_qa-{i}-{kind}", r["knowledge"], r["question"], ans,
                              _whole(ans) if kind == "hal" else [], "qa", "halueval_qa", group)


def halueval_dialogue(root: Path, limit: int | None = None) -> Iterator[Record]:
    """knowledge grounds the reply; the dialogue history plays the question."""
    for i, r in _jsonl(root / "halueval/eval_suite/dataset_halueval_dialogue.jsonl", limit):
        group = digest(r["knowledge"] + r["dialogue_history"])
        for kind, ans in (("right", r["right_response"]), ("hal", r["hallucinated_response"])):
            ans = ans.strip()
            if not ans:
                continue
            yield make_record(f"halueval_dialogue-{i}-{kind}", r["knowledge"], r["dialogue_history"].strip(),
                              ans, _whole(ans) if kind == "hal" else [], "dialogue", "halueval_dialogue", group)


def halueval_summarization(root: Path, limit: int | None = None) -> Iterator[Record]:
    for i, r in _jsonl(root / "halueval/eval_suite/dataset_halueval_summarization.jsonl", limit):
        group = digest(r["document"][:2000])
        for kind, ans in (("right", r["right_summary"]), ("hal", r["hallucinated_summary"])):
            ans = ans.strip()
            if not ans:
                continue
            yield make_record(f"halueval_summarization-{i}-{kind}", r["document"], None, ans,
                              _whole(ans) if kind == "hal" else [], "summarization",
                              "halueval_summarization", group)


# ---------------------------------------------------------------- FaithBench (span-level, LLM summaries)


def faithbench(root: Path, limit: int | None = None) -> Iterator[Record]:
    """Union of the spans any annotator marked Unwanted (intrinsic or extrinsic).

    Questionable and Benign spans count as supported: they are judgement calls, and a
    firewall that flags them would mostly annoy. Samples with no annotation are faithful.
    """
    files = sorted((root / "faithbench/data_for_release").glob("batch_*.json"),
                   key=lambda p: int(p.stem.split("_")[1]))
    n = 0
    for path in files:
        for s in json.load(open(path, encoding="utf-8"))["samples"]:
            if limit is not None and n >= limit:
                return
            raw = s["summary"]
            answer = raw.strip()
            shift = len(raw) - len(raw.lstrip())
            spans = []
            for a in s.get("annotations") or []:
                if not any(str(lab).startswith("Unwanted") for lab in a["label"]):
                    continue
                st, en = a["summary_start"] - shift, a["summary_end"] - shift
                st, en = max(0, st), min(len(answer), en)
                if en > st:
                    spans.append((st, en))
            yield make_record(f"faithbench-{path.stem}-{s['sample_id']}", s["source"], None, answer,
                              spans, "summarization", "faithbench", digest(s["source"]))
            n += 1


# ---------------------------------------------------------------- XSum annotations + FRANK articles


def _unescape(text: str) -> str:
    return text.replace("\\'", "'")


def _find(summary: str, span: str, hint: int) -> tuple[int, int] | None:
    """Locate an annotated span by string search (offsets in the CSV mix 0- and 1-based)."""
    best = None
    pos = summary.find(span)
    while pos >= 0:
        if best is None or abs(pos - hint) < abs(best - hint):
            best = pos
        pos = summary.find(span, pos + 1)
    return None if best is None else (best, best + len(span))


def xsum(root: Path, limit: int | None = None, min_votes: int = 2) -> Iterator[Record]:
    """Maynez et al. spans joined with FRANK's article text (about half the docs have one).

    A character is hallucinated when at least `min_votes` of the (usually 3) annotators
    marked it, intrinsic or extrinsic: single-annotator spans are too noisy to train on.
    """
    articles = root / "frank/data/articles-wbertscore-json"
    rows = defaultdict(list)
    with open(root / "xsum_hallucination_annotations/hallucination_annotations_xsum_summaries.csv",
              encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh):
            rows[(r["bbcid"], r["system"])].append(r)
    cache: dict[str, str | None] = {}
    n = 0
    for (bbcid, system), group in sorted(rows.items()):
        if bbcid not in cache:
            path = articles / f"{bbcid}.json"
            cache[bbcid] = json.load(open(path, encoding="utf-8"))["article"] if path.is_file() else None
        article = cache[bbcid]
        if not article:
            continue
        if limit is not None and n >= limit:
            return
        summary = _unescape(group[0]["summary"]).strip()
        votes = [0] * len(summary)
        for r in group:
            if r["hallucination_type"] == "NULL" or r["hallucinated_span"] == "NULL":
                continue
            span = _unescape(r["hallucinated_span"]).strip()
            found = _find(summary, span, max(0, int(r["hallucinated_span_start"]) - 1)) if span else None
            if found:
                for k in range(*found):
                    votes[k] += 1
        spans, start = [], None
        for k, v in enumerate(votes + [0]):
            if v >= min_votes and start is None:
                start = k
            elif v < min_votes and start is not None:
                spans.append((start, k))
                start = None
        yield make_record(f"xsum-{bbcid}-{system}", article, None, summary, spans,
                          "summarization", "xsum", bbcid)
        n += 1


# ---------------------------------------------------------------- FaithDial audit (response-level, model replies)


def _faithdial_rows(root: Path) -> Iterator[tuple[str, dict[str, str], str, str]]:
    """(file id, row, response column, BEGIN column) for the gold and the GPT2/DoHA/CTRL files."""
    audit = root / "faithdial_audit/data-audit"
    for path in sorted(audit.glob("*/*.csv")):
        with open(path, encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                cols = {c.lower(): c for c in row}
                response = cols.get("response") or next(
                    (c for c in row if c.lower() in ("gpt2", "doha", "ctrl")), None)
                begin = cols.get("begin") or cols.get("begin_label")
                if response and begin:
                    yield f"{path.parent.name}-{path.stem}", row, response, begin


def faithdial(root: Path, limit: int | None = None) -> Iterator[Record]:
    """Knowledge-grounded replies written by GPT2, DoHA, CTRL and the benchmarks' humans (WoW,
    CMU-DoG, TopicalChat), labelled by FaithDial's audit with BEGIN categories.

    Any "hallucination" (incl. "partial hallucination") marks the whole reply; entailment,
    generic and uncooperative replies count as supported; unlabelled rows are skipped. BEGIN's
    hallucination also covers personal opinions and experiences the knowledge does not state,
    so this is a looser notion than a RAG answer's unsupported claim. Evaluation only.
    """
    n = 0
    for file_id, row, response, begin in _faithdial_rows(root):
        label = row[begin].strip().lower()
        answer = (row[response] or "").strip()
        knowledge = (row.get("knowledge") or row.get("evidence") or "").strip()
        if not label or not answer or not knowledge:
            continue
        if limit is not None and n >= limit:
            return
        history = (row.get("history") or "").strip() or None
        spans = _whole(answer) if "hallucinat" in label else []
        yield make_record(f"faithdial-{file_id}-{n}", knowledge, history, answer, spans, "dialogue",
                          "faithdial", digest(knowledge + (history or "") + answer))
        n += 1


# ---------------------------------------------------------------- SummEdits (span-level by diff, LLM summaries)

_WORD = re.compile(r"\w+|[^\w\s]")


def _edited_spans(original: str, edited: str) -> list[tuple[int, int]]:
    """Character spans of `edited` that differ from `original`, word by word (punctuation apart);
    (-1, -1) stands for a bare deletion, which leaves nothing in `edited` to mark."""
    a = [m.group(0) for m in _WORD.finditer(original)]
    words = list(_WORD.finditer(edited))
    ops = difflib.SequenceMatcher(a=a, b=[m.group(0) for m in words], autojunk=False).get_opcodes()
    spans = []
    for tag, _i1, _i2, j1, j2 in ops:
        if tag == "equal":
            continue
        spans.append((words[j1].start(), words[j2 - 1].end()) if j2 > j1 else (-1, -1))
    return spans


def summedits(root: Path, limit: int | None = None) -> Iterator[Record]:
    """SummEdits: an LLM-written seed summary per document, and edited copies labelled consistent
    or not by annotators.

    Consistent edits mostly reword (synonyms, rephrased clauses), which is what a RAG answer does
    to its passages, so they measure whether rewording is mistaken for hallucinating (the bundled
    detector only evaluates on this set; training on it was tried, see its card). An inconsistent copy is
    kept only when it differs from its seed summary in one place (insertions and replacements,
    not bare deletions): then that place is the hallucinated span exactly. With two or more
    edits, which one broke consistency is unknown, so those copies are skipped. Each distinct
    seed summary is also a faithful answer.
    """
    n = 0
    for path in sorted((root / "summedits/data/summedits").glob("summedits_*.json")):
        seen: set[str] = set()
        for r in json.load(open(path, encoding="utf-8")):
            doc, original, edited = r["doc"].strip(), r["original_summary"].strip(), r["summary"].strip()
            group = digest(doc)
            candidates = []
            if original and original not in seen:
                seen.add(original)
                candidates.append(("seed", original, []))
            if str(r["label"]) == "1" and edited != original:
                candidates.append(("edit", edited, []))
            elif str(r["label"]) == "0":
                spans = _edited_spans(original, edited)
                if len(spans) == 1 and spans[0][0] >= 0:
                    candidates.append(("edit", edited, spans))
            for kind, answer, spans in candidates:
                if limit is not None and n >= limit:
                    return
                yield make_record(f"summedits-{r['id']}-{kind}", doc, None, answer, spans,
                                  "summarization", "summedits", group)
                n += 1


# ---------------------------------------------------------------- hand-written RAG QA probe (span-level)

HANDWRITTEN = shared.DATA_DIR / "handwritten_rag.txt"
_MARK = re.compile(r"\[\[(.+?)\]\]")


def handwritten_rag(root: Path, limit: int | None = None, path: Path = HANDWRITTEN) -> Iterator[Record]:
    """Answers written the way an LLM answers over a passage (reworded, not copied), each with a
    twin carrying one unsupported or contradicting part. Small (24 pairs) but the one set here
    whose faithful answers paraphrase like real RAG answers; `root` is unused (it ships in the repo)."""
    items: list[dict[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("C: "):
            items.append({})
        if line[:3] in ("C: ", "Q: ", "F: ", "H: "):
            items[-1][line[0]] = line[3:].strip()
    for i, it in enumerate(items[:limit] if limit is not None else items):
        group = digest(it["C"])
        yield make_record(f"handwritten_rag-{i}-faithful", it["C"], it["Q"], it["F"], [], "qa", "handwritten_rag", group)
        answer, spans = unmark(it["H"])
        yield make_record(f"handwritten_rag-{i}-hallucinated", it["C"], it["Q"], answer, spans, "qa",
                          "handwritten_rag", group)


def unmark(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """`a [[b]] c` -> ("a b c", [span of b]); edge whitespace stays outside the span."""
    spans, answer, pos = [], "", 0
    for m in _MARK.finditer(marked):
        answer += marked[pos:m.start()]
        inner = m.group(1)
        lead = len(inner) - len(inner.lstrip())
        spans.append((len(answer) + lead, len(answer) + len(inner.rstrip())))
        answer += inner
        pos = m.end()
    return answer + marked[pos:], spans


# ---------------------------------------------------------------- LLM-written RAG QA answers (span-level)

LLM_RAG = shared.DATA_DIR / "llm_rag_answers.txt"
LLM_RAG_MULTI = shared.DATA_DIR / "llm_rag_multi_answers.txt"
_BLOCK_ID = re.compile(r"(\d+)(?:\s+@((?:\s+\d+)+))?")


def parse_llm_rag(text: str) -> tuple[list[dict[str, str]], list[str]]:
    """Blocks `### <HaluEval QA row>[ @ <passage rows>]` / `F:` / `H:` / `K:` -> items, plus one
    reason per rejected block. The optional rows after `@` are the retrieved passages, in order
    (the question's own passage among them); without them the context is the question's passage.

    A block is kept only when it is well formed: F unmarked, H with balanced, non-empty marks,
    and H without its marks different from F (the twin really changes something)."""
    items: list[dict[str, str]] = []
    rejected: list[str] = []
    block: dict[str, str] | None = None
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("### "):
            head = _BLOCK_ID.fullmatch(line[4:].strip())
            block = ({"id": head.group(1), "passages": (head.group(2) or "").strip()} if head
                     else {"id": "", "bad_header": line[4:].strip()})
            blocks.append(block)
        elif block is not None and line[:3] in ("F: ", "H: ", "K: "):
            block[line[0]] = line[3:].strip()
    for b in blocks:
        f, h = b.get("F", ""), b.get("H", "")
        marks, outside = _MARK.findall(h), _MARK.sub("", h)
        why = None
        if not b["id"] or not f or not h or b.get("K") not in ("baseless", "conflict", "overclaim"):
            why = "missing id, F, H or K"
        elif "[[" in f or "]]" in f:
            why = "marks in F"
        elif not marks or "[[" in outside or "]]" in outside or not all(m.strip() for m in marks):
            why = "no, unbalanced or empty marks in H"
        elif unmark(h)[0] == f:
            why = "H equals F"
        if why:
            rejected.append(f"{b['id'] or repr(b.get('bad_header', ''))}: {why}")
        else:
            items.append(b)
    return items, rejected


def llm_rag(root: Path, limit: int | None = None, path: Path = LLM_RAG, source: str = "llm_rag") -> Iterator[Record]:
    """HaluEval QA passages and questions (MIT) with answers written for this project by LLM sessions
    (`models/data/llm_rag_answers.txt`: only the answers are committed, the passages are joined from
    ../shared by row). Faithful answers reword the passage; each twin adds one marked unsupported
    or contradicting part. Grouped by question like halueval_qa, so dev rows share no passage with
    training rows of any HaluEval-based source."""
    items, rejected = parse_llm_rag(path.read_text(encoding="utf-8"))
    if rejected:
        print(f"{source}: {len(rejected)} malformed blocks skipped (first: {rejected[0]})", file=sys.stderr)
    passages = {it["id"]: [int(k) for k in it["passages"].split()] or [int(it["id"])] for it in items}
    wanted = {k for rows in passages.values() for k in rows}
    rows = {i: r for i, r in _jsonl(root / "halueval/eval_suite/dataset_halueval_qa.jsonl", None) if i in wanted}
    for n, it in enumerate(items):
        if limit is not None and n >= limit:
            return
        r = rows[int(it["id"])]
        group = digest(r["question"])
        ctx = [rows[k]["knowledge"] for k in passages[it["id"]]]
        context = ctx[0] if len(ctx) == 1 else ctx
        yield make_record(f"{source}-{it['id']}-faithful", context, r["question"], it["F"], [], "qa",
                          source, group)
        answer, spans = unmark(it["H"])
        yield make_record(f"{source}-{it['id']}-{it['K']}", context, r["question"], answer, spans, "qa",
                          source, group)


def llm_rag_multi(root: Path, limit: int | None = None) -> Iterator[Record]:
    """Like llm_rag, with three retrieved passages per question (its own and two other HaluEval QA
    passages of the same split that share rare words with the question, in shuffled order) and longer,
    chat-style answers (`models/data/llm_rag_multi_answers.txt`)."""
    return llm_rag(root, limit, LLM_RAG_MULTI, "llm_rag_multi")


# ---------------------------------------------------------------- FRANK and QAGS (human judgements of real summaries)


def frank(root: Path, limit: int | None = None) -> Iterator[Record]:
    """FRANK: summaries by nine real systems (bart, bert_sum, bus, pgn, s2s on CNN/DM; BERTS2S,
    TConvS2S, TranS2S, PtGen on XSum) of 499 articles, judged sentence by sentence by three annotators.

    The per-sentence annotations (human_annotations_sentence.json) are missing from the snapshot, so
    the label is summary-level: `Factuality` is the share of the summary's sentences judged free of
    factual errors, and any summary below 1.0 is hallucinated as a whole (`_whole`). That is exact
    when every sentence was judged wrong (Factuality 0, e.g. every one-sentence XSum summary) and a
    superset of the wrong sentences otherwise (441 multi-sentence summaries between 0 and 1).
    answer = the `<system>_lines` sentences FRANK annotated, joined by a space (Factuality x their
    count is always whole). All 2246 annotated summaries have their article, so all are yielded
    (1436 hallucinated); a row without article or sentences would be skipped and counted on stderr.
    Evaluation only, and not independent of two training sources: the XSum half is the same
    article/summary pairs as `xsum` (773 of its 996 in xsum's train split), and 202 of the 250
    CNN/DM articles are HaluEval summarization documents (the id says which half: frank-cnndm/-bbc).
    """
    arts = root / "frank/data/articles-wbertscore-json"
    cache: dict[str, dict | None] = {}
    n, skipped = 0, 0
    for r in json.load(open(root / "frank/data/human_annotations.json", encoding="utf-8")):
        h, model = r["hash"], r["model_name"]
        if h not in cache:
            path = arts / f"{h}.json"
            cache[h] = json.load(open(path, encoding="utf-8")) if path.is_file() else None
        art = cache[h] or {}
        article = (art.get("article") or "").strip()
        answer = " ".join(_unescape(s).strip() for s in art.get(f"{model}_lines") or [] if s.strip())
        if not article or not answer:
            skipped += 1
            continue
        if limit is not None and n >= limit:
            break
        spans = _whole(answer) if float(r["Factuality"]) < 1.0 else []
        yield make_record(f"frank-{r['dataset']}-{h}-{model}", article, None, answer, spans,
                          "summarization", "frank", digest(article))
        n += 1
    if skipped:
        print(f"frank: {skipped} annotated summaries without article or sentences skipped", file=sys.stderr)


def qags(root: Path, limit: int | None = None) -> Iterator[Record]:
    """QAGS: Bottom-Up summaries of CNN/DM articles (235) and BART summaries of XSum articles (239),
    each summary sentence judged supported by the article or not ("yes"/"no") by three MTurk workers.

    answer = the summary sentences joined by a space; a sentence is a hallucinated span when the
    majority of its workers answered "no" (with three workers: two or three). Yields 474 summaries,
    245 with at least one span. Evaluation only; 193 of the CNN/DM articles are also HaluEval
    summarization documents (171 in its train split).
    """
    n = 0
    for name in ("cnndm", "xsum"):
        for i, r in _jsonl(root / f"qags/data/mturk_{name}.jsonl", None):
            if limit is not None and n >= limit:
                return
            article = r["article"].strip()
            answer, spans = "", []
            for s in r["summary_sentences"]:
                sentence = s["sentence"].strip()
                if not sentence:
                    continue
                if answer:
                    answer += " "
                votes = [str(x["response"]).strip().lower() for x in s["responses"]]
                if 2 * votes.count("no") > len(votes):
                    spans.append((len(answer), len(answer) + len(sentence)))
                answer += sentence
            if not article or not answer:
                continue
            yield make_record(f"qags-{name}-{i}", article, None, answer, spans, "summarization", "qags",
                              digest(article))
            n += 1


# ---------------------------------------------------------------- ExpertQA and AttributionBench (already eval JSONL)


def _question_group(question: str) -> str:
    """Split key of a QA item: the question with its whitespace collapsed (one AttributionBench copy
    of an ExpertQA question differs from the original only by a trailing space)."""
    return digest(" ".join(question.split()))


def _eval_rows(path: Path, source: str, limit: int | None, task: Callable[[dict], str]) -> Iterator[Record]:
    for _i, r in _jsonl(path, limit):
        spans = [(lab["start"], lab["end"]) for lab in r["labels"]]
        yield make_record(r["id"], r["context"], r["question"], r["answer"], spans, task(r), source,
                          _question_group(r["question"] or ""))


def expertqa(root: Path, limit: int | None = None) -> Iterator[Record]:
    """ExpertQA (shared expertqa.jsonl, already in this format): GPT-4 answers to experts' questions
    (retrieve-and-read or post-hoc cited), judged claim by claim by the experts against the cited
    evidence. Labels are kept as converted there: the claims judged Partial or Incomplete support
    (whole answers with claim spans, or single claims as the whole answer); Complete = supported.
    task "rag_qa" or "posthoc_attributed_qa" from the row; grouped by question. Evaluation only.
    """
    return _eval_rows(root / "expertqa/expertqa.jsonl", "expertqa", limit, lambda r: r["task"])


def attributionbench(root: Path, limit: int | None = None) -> Iterator[Record]:
    """AttributionBench subset (HAGRID, Stanford-GenSearch, AttrScore-GenSearch, ExpertQA): one
    claim (a sentence of a real system's answer) per record with the references it cites; a claim
    judged not attributable to them is one whole-answer span, balanced 50/50 by construction.

    The sub-dataset (second part of the id, `attributionbench/<sub>/...`) is appended to the task
    ("rag_qa/HAGRID") so evaluations report it apart. Grouped by question with the same key as
    `expertqa`, so a question shared by both sets lands on the same side of any split. Evaluation only.
    """
    def task(r: dict) -> str:
        parts = r["id"].split("/")
        return f"{r['task']}/{parts[1]}" if len(parts) > 2 else r["task"]

    return _eval_rows(root / "attributionbench_subset/attributionbench_subset.jsonl", "attributionbench",
                      limit, task)


def real_rag(root: Path, limit: int | None = None) -> Iterator[Record]:
    """Answers real small LLMs wrote to held-out HaluEval QA questions, spans labelled against a guide
    (real_rag.py, answers in models/data/real_rag/; imported late: it uses this module's helpers). Evaluation only."""
    from models.pipelines.hallucination.real_rag import real_rag as load

    return load(root, limit)


SOURCES: dict[str, Callable[..., Iterator[Record]]] = {
    "halueval_qa": halueval_qa,
    "halueval_dialogue": halueval_dialogue,
    "halueval_summarization": halueval_summarization,
    "faithbench": faithbench,
    "xsum": xsum,
    "faithdial": faithdial,
    "summedits": summedits,
    "handwritten_rag": handwritten_rag,
    "llm_rag": llm_rag,
    "llm_rag_multi": llm_rag_multi,
    "frank": frank,
    "qags": qags,
    "expertqa": expertqa,
    "attributionbench": attributionbench,
    "real_rag": real_rag,
}

# Small span sets get a bigger dev share so their dev metrics mean something.
# FaithDial's audit, the hand-written probe and the human-judged sets of real system outputs
# (FRANK, QAGS, ExpertQA, AttributionBench) are evaluation only: all of them go to dev.
DEV_FRACTION = {"faithbench": 0.25, "xsum": 0.25, "faithdial": 1.0, "summedits": 0.2, "handwritten_rag": 1.0,
                "frank": 1.0, "qags": 1.0, "expertqa": 1.0, "attributionbench": 1.0, "real_rag": 1.0}


def convert(source: str, root: Path, out: Path, dev_fraction: float | None = None,
            limit: int | None = None) -> dict[str, int]:
    frac = dev_fraction if dev_fraction is not None else DEV_FRACTION.get(source, 0.1)
    parts: dict[str, list[Record]] = {"train": [], "dev": []}
    for rec in SOURCES[source](root, limit=limit):
        parts[split_of(rec["group"], frac)].append(rec)
    return {split: write_jsonl(out / f"{source}.{split}.jsonl", recs) for split, recs in parts.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data/hallucination folder")
    ap.add_argument("--out", type=Path, default=shared.HALLUCINATION_CACHE)
    ap.add_argument("--sources", nargs="+", choices=sorted(SOURCES), default=sorted(SOURCES))
    ap.add_argument("--dev-fraction", type=float, default=None, help="override the per-source default")
    ap.add_argument("--limit", type=int, default=None, help="read at most N items per source (tests)")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: data folder {args.data} not found (set TRUTHLENS_DATA)", file=sys.stderr)
        return 2
    for source in args.sources:
        counts = convert(source, args.data, args.out, args.dev_fraction, args.limit)
        print(f"{source}: train {counts['train']}  dev {counts['dev']}  -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
