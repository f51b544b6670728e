"""Render the sentinel's model card (models/sentinel/README.md) from its metrics.json.

    python -m models.pipelines.sentinel.card models/sentinel [--latency]

Rendering from the metrics file keeps the card and the numbers from drifting apart when
`make models` retrains. `--latency` measures single-input CPU latency through the serving
wrapper (extproc.inference) and stores it in metrics.json first. The training sources'
dataset names and licenses are in sources.json beside this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from models import shared

SOURCES: dict[str, str] = json.loads(Path(__file__).with_name("sources.json").read_text(encoding="utf-8"))


def prefilter_section(pf: dict[str, Any]) -> list[str]:
    c, dev = pf["config"], pf["dev"]
    cv = pf.get("cross_validation")
    band = dev["band"]
    lines = [
        "## Lexical prefilter (`prefilter.npz`)",
        "",
        "A logistic regression over word unigrams/bigrams, the opening word and pair and a length bucket "
        "(`extproc/inference/prefilter.py`, trained by "
        f"`models/pipelines/sentinel/prefilter.py` on the same training prompts in {pf['train_seconds']} s; "
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
    lines += ["", shared.table([[s, r["n"], r["coverage"], r["accuracy"]] for s, r in dev["per_source"].items()],
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
        f"- Base model: {shared.BASE_DESCRIPTION}",
        f"- Recommended threshold: **{m['threshold']}** (maximises balanced accuracy on dev; stored in "
        "`truthlens.json` provenance.recommended_threshold)",
        f"- max_length {m['max_length']} tokens, seed {m['seed']}, config `models/sentinel/train.yaml`",
        shared.classifier_card_lines(m),
        "",
        "## Data (split by source)",
        "",
        "Dev sets are whole datasets never seen in training, so dev accuracy measures transfer to new "
        "phrasing and sources. Prompts that occur in both (after lower-casing) are removed from dev. "
        "Factual training prompts randomly gain or lose a trailing `?` (NQ-open queries carry none), so "
        "punctuation is not a label cue; the tokenizer is uncased, so case cannot be one either.",
        "",
        shared.table([[s, n, SOURCES.get(s, "")] for s, n in cfg_train["per_source"].items()],
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
        shared.confusion_table(dev),
        "",
        "Per source:",
        "",
        shared.per_source_table(dev, SOURCES),
    ]
    if m.get("prefilter"):
        parts += ["", *prefilter_section(m["prefilter"])]
    if border:
        parts += ["", "Borderline sets (loosely labelled benchmark categories, and SelfAware-unanswerable, which has no "
                  "training label; not part of dev accuracy; for a set listed as factual the accuracy is the share "
                  "that gets checked): "
                  f"accuracy {border['accuracy']} (n={border['n']})", "", shared.per_source_table(border, SOURCES)]
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



def main(argv: list[str] | None = None) -> int:
    return shared.card_main(argv, __doc__.splitlines()[0], "sentinel", sentinel_card)


if __name__ == "__main__":
    sys.exit(main())
