"""How much do the writer's own token log-probabilities say about hallucination? (#16 item 4)

    .venv/bin/python -m bench.writer_logprobs

The gateway can ask the upstream for `logprobs` / `top_logprobs` and reads them into three numbers
(`extproc.inference.upstream.upstream_signals`): mean log p of the chosen tokens, the least likely chosen
token, and the mean entropy over the top alternatives. No public labelled set carries the writers'
logprobs, but `models/data/real_rag` was written here by two local models whose weights we have, so the
logprobs an upstream would have returned can be recomputed: each labelled answer is teacher-forced through
its own writer (SmolLM2-135M-Instruct or Gemma 3 270M, from their GGUF packages, through transformers) with
the exact prompt it was generated from (`real_rag_generate`), at temperature 1 (what an OpenAI-style
`logprobs` field reports), top alternatives `truthlens.signals.upstream_top_logprobs` (5). The three
numbers then go through the same function the gateway uses.

Reported per split of the real-output suite (`suite_split` of the question digest, as in
`bench/real_output_suite.py`): each number's AUROC alone (oriented: low logprob = doubt), and a logistic
stack of the served score (cached by the suite: run `make eval` first) with each number, fitted on real_rag's
suite-dev part and read on its suite-test part, pooled and per writer. Caveats: the answer is re-tokenized
from its stripped text, so a token boundary can differ from the sampled one; these writers are tiny models, not the deployed LLMs a
gateway fronts; 260 answers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common import REPO, command, machine_info, write_results
from extproc.evaluation.metrics import auroc
from extproc.evaluation.suite import suite_split
from extproc.inference.calibration import fit_platt
from extproc.inference.upstream import upstream_signals
from models.pipelines.hallucination import real_rag_generate as gen
from models.pipelines.hallucination.convert import DEFAULT_DATA
from models.pipelines.hallucination.real_rag import load_answers
from models.pipelines.hallucination.records import digest

TOP = 5  # = the config default truthlens.signals.upstream_top_logprobs
SIGNALS = ("mean_logprob", "min_logprob", "mean_entropy")


def writer_tokens(model_name: str, answers: list[dict[str, Any]], rows: list[dict[str, Any]],
                  threads: int) -> dict[str, list[tuple[float, list[float]]]]:
    """id -> (log p of each answer token, log p of the top alternatives) under its writer and prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    folder, name = gen.model_file(model_name)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    out: dict[str, list[tuple[float, list[float]]]] = {}
    for a in answers:
        user = gen.user_text(rows, a["passage_rows"], rows[a["row"]]["question"])
        if model_name == "smollm2":
            msgs = [{"role": "system", "content": gen.SYSTEM}, {"role": "user", "content": user}]
            prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True)["input_ids"][0].tolist()
            answer = a["answer"]
        else:  # completion-style base model: the answer followed "Answer:" after a space
            prompt = tok(f"{gen.SYSTEM}\n\n{user}\nAnswer:")["input_ids"]
            answer = " " + a["answer"]
        ids = tok(answer, add_special_tokens=False)["input_ids"]
        if not ids:
            out[a["id"]] = []
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(1, torch.tensor(ids)[:, None])[:, 0]
        top = logp.topk(TOP, dim=-1).values
        out[a["id"]] = [(float(c), [float(v) for v in t]) for c, t in zip(chosen, top)]
    return out


def doubt(sig: dict[str, float], name: str) -> float:
    """Oriented so that higher = more doubt: low logprobs and high entropy."""
    return sig[name] if name == "mean_entropy" else -sig[name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data/hallucination folder")
    ap.add_argument("--served", type=Path,
                    default=REPO / "data-cache" / "suite" / "scores" / "served" / "real_rag.jsonl",
                    help="the suite's cached served scores for real_rag (make eval)")
    ap.add_argument("--cache", type=Path, default=REPO / "data-cache" / "writer-logprobs.json",
                    help="per-token logprobs of the teacher-forced passes (reused when present)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "writer-logprobs.md")
    ap.add_argument("--fusion-data", type=Path, default=None, metavar="FILE.jsonl",
                    help="also write the suite-dev answers of --fusion-writers in `truthlens fit-upstream`'s format")
    ap.add_argument("--fusion-writers", nargs="+", default=["smollm2"], choices=list(gen.MODELS))
    ap.add_argument("--fusion", type=Path, default=None, metavar="FILE.json",
                    help="a `truthlens fit-upstream` file to read on the suite-test answers through the gateway's "
                         "own WriterFusion (models/upstream-fusion/smollm2.json)")
    args = ap.parse_args(argv)

    rows = gen.load_rows(args.data)
    answers = load_answers()
    tokens: dict[str, list[tuple[float, list[float]]]] = {}
    if args.cache.is_file():  # the teacher-forced passes take minutes; delete the file after changing answers
        tokens = {k: [(lp, top) for lp, top in v] for k, v in json.loads(args.cache.read_text(encoding="utf-8")).items()}
    for model_name in gen.MODELS:
        todo = [a for a in answers if a["model"] == model_name and a["id"] not in tokens]
        if todo:
            tokens.update(writer_tokens(model_name, todo, rows, args.threads))
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    args.cache.write_text(json.dumps(tokens), encoding="utf-8")
    served = {}
    if args.served.is_file():
        for line in args.served.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            served[r["id"]] = float(r["out"]["score"])

    items = []
    for a in answers:
        s = upstream_signals(tokens[a["id"]])
        if s is None:  # an empty answer: nothing was sampled, nothing to read
            continue
        items.append({"id": a["id"], "model": a["model"], "hallucinated": bool(a["labels"]),
                      "split": suite_split(digest(rows[a["row"]]["question"])),
                      "signals": {"mean_logprob": s.mean_logprob, "min_logprob": s.min_logprob,
                                  "mean_entropy": s.mean_entropy if s.mean_entropy is not None else 0.0},
                      "tokens": s.tokens, "served": served.get(a["id"])})

    def auc(part: list[dict], score) -> float | None:  # type: ignore[no-untyped-def]
        return auroc([score(i) for i in part], [i["hallucinated"] for i in part])

    table: dict[str, dict[str, float | None]] = {}
    groups = {f"{w} {sp}": [i for i in items if i["model"] == w and i["split"] == sp]
              for w in gen.MODELS for sp in ("dev", "test")}
    groups |= {f"all {sp}": [i for i in items if i["split"] == sp] for sp in ("dev", "test")}
    for name in SIGNALS:
        table[name] = {g: auc(part, lambda i, n=name: doubt(i["signals"], n)) for g, part in groups.items()}
    table["length (tokens)"] = {g: auc(part, lambda i: float(i["tokens"])) for g, part in groups.items()}
    stacks: dict[str, dict[str, Any]] = {}
    have = [i for i in items if i["served"] is not None]
    if have:
        table["served"] = {g: auc([i for i in part if i["served"] is not None], lambda i: i["served"])
                           for g, part in groups.items()}
        # pooled, and for one writer alone: logprob scales are the writer's own
        for scope in ("all", *gen.MODELS):
            mine = [i for i in have if scope == "all" or i["model"] == scope]
            dev = [i for i in mine if i["split"] == "dev"]
            test = [i for i in mine if i["split"] == "test"]
            for name in SIGNALS:
                fit = fit_platt([i["served"] for i in dev], [i["hallucinated"] for i in dev], "served",
                                signals={name: [doubt(i["signals"], name) for i in dev]})
                stacks.setdefault(scope, {})[name] = {
                    "weight": fit.signals[name], "a": fit.a, "b": fit.b, "dev": len(dev), "test": len(test),
                    "served_test_auroc": auc(test, lambda i: i["served"]),
                    "test_auroc": auc(test, lambda i, f=fit, n=name: f(i["served"], {n: doubt(i["signals"], n)}))}
    if args.fusion_data is not None:
        dev_rows = [{"model": i["model"], "score": i["served"], "upstream": i["signals"], "hallucinated": i["hallucinated"]}
                    for i in have if i["split"] == "dev" and i["model"] in args.fusion_writers]
        args.fusion_data.write_text("".join(json.dumps(r) + "\n" for r in dev_rows), encoding="utf-8")
    fused = fusion_on_test(args.fusion, have) if args.fusion is not None else {}
    cols = list(groups)
    lines = [
        "# Writer logprobs on real_rag (#16 item 4)", "",
        f"Command: `{command('bench.writer_logprobs', argv)}`  ",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()), "",
        "Each labelled `models/data/real_rag` answer teacher-forced through the model that wrote it, with its generation",
        "prompt, top 5 alternatives: the logprobs an OpenAI-style upstream would have returned. The three numbers are the",
        "gateway's own (`upstream_signals`: the `x-truthlens-upstream-*` headers), oriented so that higher = more doubt.",
        "AUROC per writer and suite split (n answers, hallucinated):", "",
        "| signal | " + " | ".join(f"{g} ({len(groups[g])}, {sum(i['hallucinated'] for i in groups[g])})" for g in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for name, vals in table.items():
        lines.append(f"| {name} | " + " | ".join("-" if vals[g] is None else f"{vals[g]:.3f}" for g in cols) + " |")
    if stacks:
        lines += ["", "Stacked with the served score: a logistic fit on the suite-dev answers of the scope, read on its",
                  "suite-test answers (the served score alone beside it):", "",
                  "| scope (dev / test answers) | signal | weight | suite-test AUROC | served alone |", "|---|---|---|---|---|"]
        lines += [f"| {scope} ({s['dev']} / {s['test']}) | {n} | {s['weight']:.3f} | {s['test_auroc']:.3f} | "
                  f"{s['served_test_auroc']:.3f} |" for scope, by in stacks.items() for n, s in by.items()]
    if fused:
        lines += ["", f"The shipped writer fit (`{args.fusion.relative_to(REPO) if args.fusion.is_relative_to(REPO) else args.fusion}`,"
                  " `truthlens fit-upstream` on the writer's suite-dev answers) read on suite-test through the gateway's",
                  "`WriterFusion`; 95 % paired bootstrap interval of the AUROC difference (2000 resamples):", "",
                  "| writer | test answers (hallucinated) | served | fused | fused - served |", "|---|---|---|---|---|"]
        lines += [f"| {w} | {f['answers']} ({f['hallucinated']}) | {f['served']:.3f} | {f['fused']:.3f} | "
                  f"{f['difference']['diff']:+.3f} [{f['difference']['low']:+.3f}, {f['difference']['high']:+.3f}] |"
                  for w, f in fused.items()]
    lines += ["", "Caveats: tiny writers (135M / 270M), not the deployed LLMs a gateway fronts; answers re-tokenized from",
              "their stripped text; 260 answers, so differences under ~0.1 AUROC are within noise."]
    write_results(args.out, "\n".join(lines) + "\n", {"auroc": table, "stacks": stacks, "fusion": fused,
                                                      "items": items, "machine": machine_info()})
    print("\n".join(lines))
    return 0


def fusion_on_test(path: Path, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per writer the fit file covers: served vs fused AUROC on its suite-test answers, with the paired interval."""
    from extproc.evaluation.metrics import auroc_difference_resamples, interval
    from extproc.inference.api import DetectionResult
    from extproc.inference.upstream import UpstreamSignals, WriterFusion

    fusion = WriterFusion.load(path)
    out = {}
    for writer in sorted(fusion.fits):
        test = [i for i in items if i["model"] == writer and i["split"] == "test"]
        labels = [i["hallucinated"] for i in test]
        served = [i["served"] for i in test]
        fused = [fusion.fuse(writer, DetectionResult(score=i["served"], spans=()),
                             UpstreamSignals(i["tokens"], i["signals"]["mean_logprob"], i["signals"]["min_logprob"],
                                             i["signals"]["mean_entropy"])).score for i in test]
        diff = auroc_difference_resamples(fused, served, labels)
        out[writer] = {"answers": len(test), "hallucinated": sum(labels), "served": auroc(served, labels),
                       "fused": auroc(fused, labels), "difference": None if diff is None else interval(*diff)}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
