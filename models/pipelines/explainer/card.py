"""Render the explainer's model card (models/explainer/README.md) from its metrics.json.

    python -m models.pipelines.explainer.card models/explainer [--latency]

Rendering from the metrics file keeps the card and the numbers from drifting apart when
`make models` retrains. `--latency` measures single-input CPU latency through the serving
wrapper (extproc.inference) and stores it in metrics.json first. The NLI sources' dataset
names, splits and licenses are in sources.json beside this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from models import shared

SOURCES: dict[str, str] = json.loads(Path(__file__).with_name("sources.json").read_text(encoding="utf-8"))


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
        f"- Base model: {shared.BASE_DESCRIPTION}",
        f"- Labels `[entailment, neutral, contradiction]`, max_length {m['max_length']}, seed {m['seed']}, "
        "config `models/explainer/train.yaml`",
        f"- Recommended `nli_entailment` threshold: **{ent.get('threshold')}** "
        + (f"(lowest P(entailment) whose precision on the 3-way held-out mix is >= {ent.get('target_precision')}: "
           f"precision {ent.get('precision')}, recall {ent.get('recall')})" if ent.get("target_met") else
           f"(no cut reaches the target entailment precision {ent.get('target_precision')} on the 3-way held-out "
           f"mix; this is the most precise cut keeping >= 20 pairs: precision {ent.get('precision')}, "
           f"recall {ent.get('recall')}). Treat drops as low-confidence or set `explainer.drop_entailed: false`."),
        shared.classifier_card_lines(m),
        "",
        "## Data",
        "",
        shared.table([[s, n, SOURCES.get(s, "")] for s, n in tr["per_source"].items()],
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
        shared.per_source_table(test, SOURCES),
        "",
        "Confusion matrix (all held-out pairs):",
        "",
        shared.confusion_table(test),
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
    return shared.card_main(argv, __doc__.splitlines()[0], "explainer", explainer_card)


if __name__ == "__main__":
    sys.exit(main())
