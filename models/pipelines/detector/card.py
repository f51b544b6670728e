"""Render the detector's model card (models/detector/README.md) from its metrics.json.

    python -m models.pipelines.detector.card models/detector [--latency]

Rendering from metrics.json keeps card and numbers together when `make models` retrains.
`--latency` first measures CPU latency through the serving Detector and stores it in metrics.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from extproc.config.schema import DETECTOR_TIERS
from models import shared

# the training and dev sources' descriptions and licenses (text, beside this file)
SOURCES: dict[str, tuple[str, str]] = {
    k: (v["what"], v["license"])
    for k, v in json.loads(Path(__file__).with_name("sources.json").read_text(encoding="utf-8")).items()
}


def _f(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def _dev_table(agg: dict[str, Any], windows: dict[str, float]) -> str:
    rows = []
    for src, m in agg["by_source"].items():
        ex, sp = m["example_level"], m["span_level_char"]
        rows.append([src, m["n"], m["positives"], _f(ex["precision"]), _f(ex["recall"]), _f(ex["f1"]),
                     _f(sp["precision"]), _f(sp["recall"]), _f(sp["f1"]), _f(m["auroc"]), windows.get(src, "")])
    return shared.table(rows, ["dev source", "n", "halluc.", "ex-P", "ex-R", "**ex-F1**", "span-P", "span-R",
                         "span-F1", "AUROC", "windows"])


def _serving(m: dict[str, Any]) -> list[str]:
    """The serving pipeline's own measurements (`truthlens eval`), when recorded (one dict or a list)."""
    checks = m.get("serving_check") or []
    out = []
    for sc in [checks] if isinstance(checks, dict) else checks:
        out += [f"Serving pipeline check (`{sc['command']}`, span filters and thresholds as the gateway applies "
                f"them): {sc['data']}: n {sc['n']} ({sc['positives']} hallucinated), example-level P {sc['precision']} "
                f"/ R {sc['recall']} / **F1 {sc['f1']}**, char-span F1 {sc['span_f1']}, AUROC {sc['auroc']}.", ""]
    return out


def _flag_all_f1(m: dict[str, Any]) -> float:
    """Example F1 of flagging every answer: the baseline a detector has to beat."""
    share = m["positives"] / m["n"]
    return 2 * share / (1 + share)


def _faithdial_note(fd: dict[str, Any] | None) -> list[str]:
    """The one set of replies written by language models over retrieved knowledge that exists here."""
    if not fd:
        return []
    share = fd["positives"] / fd["n"]
    ex = fd["example_level"]
    return [
        f"- Replies written by dialogue models and people over retrieved knowledge (FaithDial's audit, "
        f"{fd['n']} replies, never trained on; {SOURCES['faithdial'][1]}): AUROC {_f(fd['auroc'])}, example "
        f"precision {_f(ex['precision'])} / recall {_f(ex['recall'])} / F1 {_f(ex['f1'])}, where flagging every "
        f"reply would score precision {share:.3f} and F1 {_flag_all_f1(fd):.3f}. Little skill: BEGIN's "
        "hallucination label also covers personal opinions and experiences that the knowledge does not state, "
        "and these replies (GPT-2-era models, human wizards) are unlike the QA answers it was trained on; "
        "what it says about modern LLM answers over retrieved passages is unmeasured here.",
    ]


def _skill(auroc: float) -> str:
    return "no skill" if auroc < 0.58 else "little skill" if auroc < 0.7 else "some skill" if auroc < 0.8 else "skill"


def _rag_note(lr: dict[str, Any] | None, hw: dict[str, Any] | None, multi: dict[str, Any] | None = None
              ) -> list[str]:
    """LLM-style answers over passages: the dev sets shaped like the project's target traffic."""
    out = []
    if lr:
        ex = lr["example_level"]
        out.append(
            f"- **LLM-style RAG answers** (`llm_rag` dev: {lr['n']} answers written by LLM sessions over HaluEval "
            f"passages whose questions are dev in every HaluEval-based source; the threshold is chosen partly on "
            f"it): AUROC {_f(lr['auroc'])} ({_skill(lr['auroc'])}), example precision {_f(ex['precision'])} / "
            f"recall {_f(ex['recall'])} / F1 {_f(ex['f1'])}, where flagging every answer scores F1 "
            f"{_flag_all_f1(lr):.3f}; it flags {ex['fp']} of {ex['fp'] + ex['tn']} faithful answers. With `llm_rag_multi` "
            "below, the closest sets here to the project's target (example F1 >= 0.70 on real RAG QA), which is "
            "still not claimed: these answers were written to an instruction, not sampled from deployed models, "
            "and their hallucinated half is balanced by construction (real traffic has fewer).")
    if multi:
        ex = multi["example_level"]
        out.append(
            f"- **Multi-passage LLM-style answers** (`llm_rag_multi` dev: {multi['n']} answers of 2-8 sentences over "
            f"three retrieved passages, the closest shape here to real RAG QA): AUROC {_f(multi['auroc'])} "
            f"({_skill(multi['auroc'])}), example precision {_f(ex['precision'])} / recall {_f(ex['recall'])} / F1 "
            f"{_f(ex['f1'])} (flagging everything: {_flag_all_f1(multi):.3f}); it flags {ex['fp']} of "
            f"{ex['fp'] + ex['tn']} faithful answers. Longer answers give a false alarm more places to happen.")
    if hw:
        ex = hw["example_level"]
        out.append(
            f"- Hand-written RAG-QA probe ({hw['n']} answers: {hw['n'] - hw['positives']} faithful rewordings of "
            f"the passage and their twins with one unsupported or contradicting part; never trained on, not used "
            f"to choose anything): AUROC {_f(hw['auroc'])} ({_skill(hw['auroc'])}); it flags {ex['fp']} of "
            f"{ex['fp'] + ex['tn']} faithful answers and catches {ex['tp']} of {ex['tp'] + ex['fn']} hallucinated "
            f"ones (example F1 {_f(ex['f1'])}; flagging everything: {_flag_all_f1(hw):.3f}). Faithful answers "
            "that paraphrase their passage still draw false alarms.")
    return out


def _faithful_flagged(ex: dict[str, Any]) -> float:
    """Share of faithful answers flagged: the false-alarm rate an operator will see."""
    return ex["fp"] / max(1, ex["fp"] + ex["tn"])


def _sweep_table(agg: dict[str, Any]) -> str:
    """Per-threshold trade-off on the threshold-selection sets."""
    return shared.table([[t, _f(v["precision"]), _f(v["recall"]), _f(v["f1"]), f"{_faithful_flagged(v):.2f}"]
                   for t, v in agg["threshold_sweep"].items()], ["threshold", "ex-P", "ex-R", "ex-F1", "faithful flagged"])


SUITE = shared.REPO_ROOT / "bench" / "results" / "real-output-suite.json"
# rows of the real-output suite that describe each bundled detector (candidate names of bench/real_output_suite.py)
SUITE_ROWS = {
    "models/detector": ("detector_max", "detector", "detector+verifier", "detector+verifier+pmi", "served"),
    "models/detector-deep": ("detector_deep", "detector_deep+verifier"),
    "models/detector-full": ("detector_full", "detector_full+verifier", "detector_full+verifier+pmi"),
}


def real_output_section(model_dir: str, suite: Path = SUITE) -> list[str]:
    """The card quotes the real-output suite (the criterion), with the baselines beside the model."""
    if not suite.is_file() or model_dir not in SUITE_ROWS:
        return []
    rep = json.loads(suite.read_text(encoding="utf-8"))
    rows = rep["candidates"]
    names = [n for n in ("flag_all", "length", "context_pmi", *SUITE_ROWS[model_dir]) if n in rows]
    sets = list(rep["sets"])

    def cell(cand: str, name: str, key: str) -> str:
        return _f(rows[cand]["sets"].get(name, {}).get("test", {}).get(key))

    cal_path = suite.parents[2] / model_dir / "calibration.json"
    cal = json.loads(cal_path.read_text(encoding="utf-8")) if cal_path.is_file() else None
    fits = (cal["fits"] if "fits" in cal else [cal]) if cal else []

    def fit_text(f: dict) -> str:
        extra = "".join(f", w({k}) = {w:.3f}" for k, w in (f.get("signals") or {}).items())
        kind = f"stacked with {', '.join(f['signals'])}" if f.get("signals") else "Platt"
        return (f"{kind}: a = {f['a']:.3f}{extra}, b = {f['b']:.3f}, fitted on {f['fitted_on']['answers']} suite-dev "
                f"answers of {', '.join(f['fitted_on']['sets'])}")

    served = ([f"Served with `score_method: fused` (every answer sentence verified by the NLI model; see docs/inference.md): "
               f"`calibration.json` maps the raw score to a probability ({'; '.join(fit_text(f) for f in fits)}); "
               f"recommended `thresholds.response: {fits[-1]['fitted_on']['recommended_response_threshold']}`.", ""]
              if fits else [])
    return [
        "## On real model outputs (the criterion)",
        "",
        "From [`bench/results/real-output-suite.md`](../../bench/results/real-output-suite.md) (`make eval`): answers "
        "written by real models and labelled by people, suite-test parts; thresholds chosen on the RAG sets' suite-dev "
        "parts. The dev tables further down are LLM-written and synthetic sets, which did not transfer.",
        "",
        *served,
        shared.table([[n, *[cell(n, s, "auroc") for s in sets]] for n in names], ["AUROC", *sets]),
        "",
        shared.table([[n, _f(rows[n]["threshold"]), *[f"{cell(n, s, 'f1')} / {cell(n, s, 'faithful_flagged')}" for s in sets]]
                for n in names], ["example F1 / faithful flagged", "threshold", *sets]),
        "",
    ]


def render(m: dict[str, Any], model_dir: str = "models/detector") -> str:
    cfg, tr, mach, dev = m["config"], m["train"], m["machine"], m["dev"]
    mx, mn = dev["aggregations"]["max"], dev["aggregations"]["min"]
    lat = m.get("latency", {})
    data_rows = [[s, tr["by_source"].get(s, 0), *SOURCES.get(s, ("", ""))] for s in cfg["train_mix"]]
    parts = [
        "# Detector: which answer tokens does the context not support?",
        "",
        "Token classifier over `[CLS] context passages + question [SEP] answer [SEP]` (template "
        "`{context}\\n\\nQuestion: {question}` / `{answer}`, passages joined by a blank line). Labels "
        "`[supported, hallucinated]`; only answer tokens are scored. Long contexts are cut into "
        f"{cfg['max_length']}-token windows with {cfg.get('context_overlap', 64)} tokens of overlap, each paired "
        "with the whole answer; the runtime takes the min over context windows per token (a token is supported "
        "when any window supports it: `aggregate_windows`); cards trained before that rule also list the max.",
        "",
        *real_output_section(model_dir),
        f"- Base model: {shared.BASE_DESCRIPTION}" + (f"; only its lowest **{cfg['num_layers']} layers** are kept" if cfg.get("num_layers") else ""),
        *([f"- **The quality tier**: the default `truthlens.models.detector: auto` serves it where its session runs "
           f"on CUDA (the CUDA image ships it). On a CPU it is optional: a deeper encoder than the CPU tier's, so a "
           f"larger window cost (see the latency line; over the 25 ms target for a 512-token window that the CPU tier "
           f"meets). Select it everywhere with `truthlens.models.detector: {model_dir}`."]
          if model_dir == DETECTOR_TIERS["cuda"] else
          [f"- **Optional, not the default**: a deeper encoder than the default detector's, so a larger window cost "
           f"(see the latency line; over the 25 ms target for a 512-token window that the default meets). Select it with "
           f"`truthlens.models.detector: {model_dir}` and `truthlens.thresholds.token: {m['threshold']}`."]
          if model_dir != "models/detector" else []),
        f"- **Recommended token threshold: {m['threshold']}** (`truthlens.thresholds.token`; chosen on dev only, "
        f"maximising example-level F1 on {', '.join(cfg['threshold_sources'])}; stored in `truthlens.json` "
        "provenance.recommended_token_threshold)",
        f"- Trained on **{mach['device'].upper()}** ({shared.gpu_label(mach)}{mach['cpu']}, {mach['torch_threads']} torch threads, "
        f"{mach['logical_cpus']} logical CPUs; {mach.get('note', 'shared with other jobs under `nice -n 15`')}), "
        f"torch {mach['torch']}",
        f"- Training time: {tr['seconds']:.0f} s, {tr['steps']} steps x {cfg['batch_size']} rows "
        f"({tr['examples']} examples, 1 pass){' — stopped early by the wall-clock cap' if tr.get('stopped_early_by_time_budget') else ''}",
        f"- Hyper-parameters: seed {cfg['seed']}, AdamW lr {cfg['lr']}, linear warmup {cfg['warmup_ratio']} then decay, "
        f"batch {cfg['batch_size']}, training rows {cfg['train_max_length']} tokens"
        + "".join(f" ({src}: {n})" for src, n in (cfg.get("train_max_length_by_source") or {}).items())
        + " (same template and windowing as serving; the window sharing most vocabulary with the answer is kept), "
        + ("embeddings frozen" if cfg.get("freeze_embeddings") else "nothing frozen")
        + (f" + lowest {cfg['freeze_layers']} encoder layers frozen" if cfg.get("freeze_layers") else "")
        + f", token class weights {cfg.get('class_weights')}; "
        + (f"configs `{model_dir}/train.yaml` (stage 1) and `train_stage2.yaml` (stage 2, these values)"
           if m.get("stage1") else f"config `{model_dir}/train.yaml`"),
        "- Exported: int8 dynamic-quantized ONNX"
        + (" with fused attention / layer-norm ops (`export: optimize`)" if "optimized_max_abs_diff" in m.get("export", {}) else "")
        + f", {m.get('size_bytes', 0) / 1e6:.1f} MB (+ tokenizer.json 0.5 MB); "
        f"ONNX-vs-torch max |logit diff| fp32 {_f(m.get('export', {}).get('fp32_max_abs_diff'))}, "
        f"int8 {_f(m.get('export', {}).get('final_max_abs_diff'))}",
    ]
    if m.get("stage1"):
        s1 = m["stage1"]
        parts.append(
            f"- Two stages: stage 1 (`{s1['config']}`) trained from the base for {s1['train']['seconds']:.0f} s, "
            f"{s1['train']['steps']} steps ({s1['train']['examples']} examples); stage 2 (`train_stage2.yaml`, the "
            "numbers above) continued from its checkpoint over a fresh sample (other seed). Stage-1 dev (max over "
            "windows, its threshold " + str(s1["dev_threshold"]) + "): " + "; ".join(
                f"{k} ex-F1 {_f(v['ex_f1'])} AUROC {_f(v['auroc'])}" for k, v in s1["dev_max"].items()))
    if lat:
        parts.append(
            f"- CPU latency (one answer, serving `Detector`, {lat['intra_op_threads']} intra-op threads): RAG-QA answer "
            f"median {lat['qa']['median_ms']} ms / p90 {lat['qa']['p90_ms']} ms ({lat['qa']['mean_windows']} windows); "
            f"news article median {lat['news_article']['median_ms']} ms ({lat['news_article']['mean_windows']} windows). "
            f"{lat['note']}.")
    parts += [
        "",
        "## Training data",
        "",
        "Converted by `models/pipelines/hallucination/convert.py` and `models/pipelines/hallucination/synthetic.py` into span JSONL under "
        "`data-cache/hallucination/` (never committed). Each source is split by document / question hash, so "
        "dev never shares a source text with train.",
        "",
        shared.table(data_rows, ["source", "train examples", "what", "license"]),
        "",
        "FaithBench is CC BY-NC-SA: the weights inherit a non-commercial, share-alike caveat from it.",
        "",
        "Dev only (never trained on):",
        "",
        shared.table([[s, *SOURCES.get(s, ("", ""))] for s in mx["by_source"] if s not in cfg["train_mix"]],
               ["source", "what", "license"]),
        "",
        f"## Dev metrics (int8 graph, threshold {mx['threshold']}, max over windows)",
        "",
        "Example level: an answer is flagged when any token reaches the threshold. Span level: pooled "
        "character overlap. AUROC: max token probability per answer. Definitions as in `docs/evaluation.md`.",
        "",
        _dev_table(mx, dev.get("windows_mean", {})),
        "",
        f"With the **min** over windows instead (a token counts as supported if any window supports it), "
        f"threshold {mn['threshold']}:",
        "",
        _dev_table(mn, dev.get("windows_mean", {})),
        "",
        *_serving(m),
        "Example level by token threshold on the threshold-selection dev sets, pooled (max over windows; "
        "\"faithful flagged\" = share of their faithful answers flagged, the false-alarm rate to expect):",
        "",
        _sweep_table(mx),
        "",
        "## Where it is weak",
        "",
        "- On summaries it does not discriminate: HaluEval summarization, FaithBench and XSum stay at AUROC ~0.5, "
        "and at the QA-chosen threshold their example-level F1 is below the flag-everything baseline (the share "
        "of hallucinated answers). Do not turn it on for summarization traffic expecting skill. "
        + "Dev AUROC by source: " + ", ".join(f"{k} {_f(v['auroc'])}" for k, v in mx["by_source"].items()) + ".",
        f"- Trained for {tr['seconds'] / 60:.0f} minutes on CPU: {tr['examples']} rows, one pass"
        + (f", {cfg['num_layers']} encoder layers" if cfg.get("num_layers") else "")
        + ". 3 layers is the deepest encoder that meets the 25 ms window budget on 2 CPU cores "
        "(`bench/results/detector-depth.md`, `bench/results/inference.md`).",
        *_rag_note(mx["by_source"].get("llm_rag"), mx["by_source"].get("handwritten_rag"),
                   mx["by_source"].get("llm_rag_multi")),
        *_faithdial_note(mx["by_source"].get("faithdial")),
        "- Faithful answers that reword the context are often flagged. Share of faithful dev answers "
        "flagged at the threshold: " + ", ".join(
            f"{k} {_faithful_flagged(v['example_level']):.2f}"
            for k, v in mx["by_source"].items()) + ". Tried (not shipped): 3000 NLI pairs read as answers "
        "(MNLI, SNLI, ANLI and FEVER premises as context; entailed hypotheses faithful, neutral and "
        "contradicting ones one whole span, plus entailed+unsupported pairs with the span on the second part) "
        "added to the same recipe: FaithDial AUROC 0.607 -> 0.660 and NLI-answer dev 0.52 -> 0.71, but the "
        "threshold-selection proxies went down (synthetic QA ex-F1 0.761 -> 0.752, AUROC 0.840 -> 0.816; "
        "HaluEval dialogue 0.763 -> 0.682) and the hand-written probe stayed at AUROC 0.58.",
        "- What `llm_rag` changed (same seed and recipe; dev AUROC on llm_rag / hand-written probe / synthetic QA / "
        "HaluEval QA / HaluEval dialogue): before it 0.534 / 0.536 / 0.840 / 0.973 / 0.836; llm_rag added to the "
        "old mix (synthetic 7000, HaluEval QA 2400) 0.639 / 0.578 / 0.810 / 0.982 / 0.831; the next default, 2 layers (llm_rag "
        "weighted up: synthetic 4000, HaluEval QA 1200) 0.700 / 0.616 / 0.757 / 0.958 / 0.766; that mix "
        "with 256-token training rows instead of 160 (not shipped, 1.6x the training cost) 0.672 / 0.571 / 0.759 "
        "/ 0.960 / 0.824. That recipe (kept, plus llm_rag_multi) trades template-made synthetic skill for skill on LLM-written "
        "answers, the traffic the detector is for; it was chosen on llm_rag dev, and the probe (never used to "
        "choose) moved the same way.",
        "- Depth is what LLM-written answers need. Same data (llm_rag_multi's first 1580 questions), seed and "
        "recipe, lowest 2 / 3 / 4 encoder layers (dev AUROC on llm_rag / llm_rag_multi's 252-answer dev of that "
        "time / hand-written probe / synthetic QA / HaluEval QA / HaluEval dialogue): 2 layers (the default "
        "before) 0.690 / 0.664 / 0.594 / 0.748 / 0.966 / 0.823; 3 layers 0.828 / 0.733 / 0.755 / 0.854 / 0.986 / "
        "0.739; 4 layers 0.891 / 0.799 / 0.823 / 0.908 / 0.990 / 0.814. 3 layers is the deepest encoder whose "
        "512-token window stays under the 25 ms target on 2 CPU cores (21 ms end to end), so `models/detector` "
        "has 3 and the opt-in `models/detector-deep` 4.",
        "- What `llm_rag_multi` changed (three retrieved passages per question, 384-token training rows for "
        "them; same seed and recipe, AUROC in the order above). Its first 1580 questions, against none: 2 layers "
        "0.700 / 0.553 / 0.616 / 0.757 / 0.958 / 0.766 -> 0.690 / 0.664 / 0.594 / 0.748 / 0.966 / 0.823, 4 layers "
        "0.826 / 0.584 / 0.760 / 0.859 / 0.982 / 0.767 -> 0.891 / 0.799 / 0.823 / 0.908 / 0.990 / 0.814. The "
        "3200 questions added next (4780 in all: half with conflicts that mix up the passages, half with "
        "thorough 3-8 sentence answers), at 3 layers: llm_rag 0.828 -> 0.882, llm_rag_multi on its 752-answer "
        "dev 0.746 -> 0.847, probe 0.755 -> 0.733, synthetic QA 0.854 -> 0.907, HaluEval QA 0.986 -> 0.977, "
        "dialogue 0.739 -> 0.827, for 2.2x the training time (943 -> 2101 s); at 4 layers: llm_rag 0.891 -> 0.893, "
        "llm_rag_multi 0.825 -> 0.889, probe 0.823 -> 0.726, synthetic QA 0.908 -> 0.944, HaluEval QA 0.990 -> 0.983, "
        "dialogue 0.814 -> 0.807 (1214 -> 2642 s). The 48-answer probe is small, but both depths now sit at ~0.73 on it: "
        "the new items may have taught a style its faithful rewordings do not share.",
        "- Earlier attempts to teach it rewording (not shipped; hand-written probe AUROC scored one answer at a "
        "time, where the model shipped before llm_rag got 0.56): (a) SummEdits added to the training mix (1948 LLM summaries: consistent "
        "rewordings faithful, single inconsistent edits as spans): synthetic QA AUROC 0.840 -> 0.854, FaithDial "
        "0.607 -> 0.617, SummEdits dev 0.53 -> 0.61, but HaluEval dialogue 0.836 -> 0.787 and the probe 0.53; "
        "(b) that plus 70 % of synthetic answers reworded before perturbing (`models.pipelines.hallucination.synthetic --p-reword "
        "0.7`: synonyms, other date and number forms, asides dropped, passives turned): reworded synthetic dev "
        "0.832 -> 0.845, but verbatim synthetic dev 0.840 -> 0.834, dialogue 0.792, and the probe 0.50; (c) recipe "
        "(b) with all 6 encoder layers (904 s of training, ~2.2x the window cost, over the 25 ms budget): "
        "synthetic QA 0.869-0.880, HaluEval QA 0.982, FaithDial 0.668, but dialogue 0.733 and the probe 0.56. "
        "Rule-based rewording and summary edits do not carry over to answers that an LLM rewrites freely; "
        "training data with LLM-written faithful answers over retrieved passages was what was missing "
        "(`llm_rag` now supplies 2000 such items).",
        "- `synthetic_qa` dev is synthetic: its perturbations come from templates and HaluEval's ChatGPT answers, "
        "and its faithful answers copy the passage; `llm_rag` dev is the closer proxy for real RAG answers, but "
        "its answers were written to an instruction by LLM sessions (and its passages are HotpotQA's short "
        "Wikipedia extracts), not sampled from deployed models over retrieved web pages.",
        "- HaluEval answers carry a length artefact (right answers are bare entities, wrong ones full "
        "sentences); its dev numbers overstate real-world skill.",
        "- Summarization (FaithBench, XSum) is hard for it: spans are subtle, labels disagree between "
        "annotators, and XSum's lowercased text differs from what LLMs write.",
        "- Long contexts: every window is scored alone and the runtime keeps the max, so a claim supported "
        "only in a later window can still be flagged by an earlier one (see the min-aggregation table).",
        "- It learned unsupported additions inside otherwise grounded answers. An answer with no grounded part "
        "at all (e.g. a claim that shares only its subject with the context) is still detected, but its spans "
        "are a token or two (\"in\", \"the\") rather than the claim. Tried (not shipped): 8 % such answers "
        "added to the synthetic set, same recipe and seed. It flagged the claim in that case, but on the same "
        "new dev it was a wash (synthetic QA example F1 0.744 vs 0.742, AUROC 0.797 vs 0.796; HaluEval QA F1 "
        "0.929 vs 0.935; dialogue 0.732 vs 0.706), its spans were more fragmented, and it moved the dev-chosen "
        "token threshold (0.60).",
        "",
        "## Rebuild",
        "",
        "```",
        "PYTHONPATH=. .venv/bin/python -m models.pipelines.hallucination.convert --out data-cache/hallucination",
        "PYTHONPATH=. .venv/bin/python -m models.pipelines.hallucination.synthetic --out data-cache/hallucination",
        f"PYTHONPATH=. .venv/bin/python -m models.pipelines.detector.train --config {model_dir}/train.yaml --out {model_dir}",
        f"PYTHONPATH=. .venv/bin/python -m models.pipelines.detector.card {model_dir} --latency",
        "```",
        "",
        "`--eval-only` re-scores the exported model on dev without retraining; `--max-steps N` caps a run.",
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = shared.card_cli(__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("data-cache/hallucination"),
                    help="converted dev sets the latency is measured on")
    args = ap.parse_args(argv)
    path = args.model_dir / "metrics.json"
    m = json.loads(path.read_text(encoding="utf-8"))
    if args.latency:
        m["latency"] = shared.measure_latency(args.model_dir, "detector", threads=m["config"].get("threads") or 2,
                                              data_dir=args.data)
        path.write_text(json.dumps(m, indent=2) + "\n", encoding="utf-8")
    (args.model_dir / "README.md").write_text(render(m, f"models/{args.model_dir.name}"), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
