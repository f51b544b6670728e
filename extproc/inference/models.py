"""Sentinel, detector and explainer wrappers over one ONNX session each.

Each wrapper splits its work in three stages so the engine can run them on
different threads: `prepare` (tokenize + window, pure CPU), `OnnxModel.infer`
(the batched forward pass, run by the batcher's worker thread) and `finish`
(window aggregation). `predict_batch` chains them synchronously for callers
without an event loop (eval CLI, tests, training scripts).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from extproc.inference.manifest import MODEL_FILE, TOKENIZER_FILE, Manifest, ManifestError, load_manifest
from extproc.inference.runtime import ProviderUnavailable, RuntimeOptions, SessionInfo, check_session, create_session, pad_rows, softmax
from extproc.inference.windowing import (
    PairInput,
    PairLayout,
    Row,
    aggregate_windows,
    detector_input,
    nli_inputs,
    prepare_tokenizer,
    probe_layout,
    prompt_rows,
    template_overhead,
)

log = logging.getLogger(__name__)

ROLE_TASKS = {"sentinel": "sequence-classification", "detector": "token-classification", "explainer": "nli"}
_PAD_TOKENS = ("[PAD]", "<pad>", "<|padding|>", "[pad]")


def _pad_id(path: Path, tokenizer: Tokenizer, manifest: Manifest) -> int:
    if manifest.pad_token_id is not None:
        return manifest.pad_token_id
    padding = json.loads(path.read_text(encoding="utf-8")).get("padding") or {}
    if isinstance(padding.get("pad_id"), int):
        return padding["pad_id"]
    for tok in _PAD_TOKENS:
        tid = tokenizer.token_to_id(tok)
        if tid is not None:
            return tid
    return 0  # masked out by attention_mask anyway


class OnnxModel:
    """One model directory: manifest, tokenizer, session. Built once, shared by all requests."""

    def __init__(self, directory: str | Path, role: str, options: RuntimeOptions, max_batch_tokens: int = 16384) -> None:
        self.path = Path(directory)
        self.role = role
        self.manifest = load_manifest(self.path)
        expected = ROLE_TASKS[role]
        if self.manifest.task != expected:
            raise ManifestError(f"{self.path}: {role} needs task {expected!r}, manifest says {self.manifest.task!r}")
        tok_path = self.path / TOKENIZER_FILE
        try:
            tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception subclasses
            raise ManifestError(f"{tok_path}: not a loadable tokenizers file ({exc})") from exc
        self.pad_id = _pad_id(tok_path, tokenizer, self.manifest)
        self.tokenizer = prepare_tokenizer(tokenizer)
        self.layout: PairLayout = probe_layout(self.tokenizer)
        try:
            self.session = create_session(self.path / MODEL_FILE, options,
                                          int8=self.manifest.provenance.get("quantize") == "int8")
        except ProviderUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - onnxruntime's load errors share no base class
            raise ManifestError(f"{self.path / MODEL_FILE}: onnxruntime could not load it ({exc})") from exc
        self.info: SessionInfo = check_session(self.session, self.manifest, str(self.path))
        self._check_outputs()
        if self.manifest.task == "token-classification":
            cost = template_overhead(self.tokenizer, self.layout, self.manifest.template)
            if cost > self.manifest.max_length // 2:
                raise ManifestError(
                    f"{self.path}: template takes {cost} of max_length {self.manifest.max_length} tokens in every "
                    "window; at most half is allowed (raise max_length or shorten template.first)"
                )
        self.max_batch_tokens = max_batch_tokens

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def provider(self) -> str:
        return self.info.provider

    def _check_outputs(self) -> None:
        """One tiny forward pass: the output width must match the label count."""
        row = (
            prompt_rows(self.tokenizer, self.layout, self.manifest.template, ["ok"], self.manifest.max_length)
            if self.manifest.task == "sequence-classification"
            else nli_inputs(self.tokenizer, self.layout, "ok", ["ok"], self.manifest.max_length, 0)[0].rows
        )
        out = self.session.run([self.info.output_name], pad_rows(row, self.info.input_names, self.pad_id, self.info.input_types))[0]
        want = 3 if self.manifest.task == "token-classification" else 2
        if out.ndim != want or out.shape[-1] not in (len(self.manifest.labels), 1):
            raise ManifestError(
                f"{self.path}: output {self.info.output_name} has shape {list(out.shape)}; "
                f"{self.manifest.task} with labels {list(self.manifest.labels)} needs rank {want} "
                f"and last dim {len(self.manifest.labels)}"
            )

    def infer(self, rows: Sequence[Row]) -> list[np.ndarray]:
        """Probabilities per row ([len, labels] for token tasks, [labels] otherwise).

        Rows are sorted by length and cut into sub-batches whose padded size
        stays under max_batch_tokens, so one long row does not pad many short ones.
        """
        if not rows:
            return []
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out: list[np.ndarray | None] = [None] * len(rows)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and len(rows[order[end]]) * (end - start + 1) <= self.max_batch_tokens:
                end += 1
            chunk = [rows[i] for i in order[start:end]]
            feeds = pad_rows(chunk, self.info.input_names, self.pad_id, self.info.input_types)
            probs = softmax(self.session.run([self.info.output_name], feeds)[0])
            for j, i in enumerate(order[start:end]):
                out[i] = probs[j, : len(rows[i])] if probs.ndim == 3 else probs[j]
            start = end
        return out  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class TokenScores:
    """Detector output for one answer: P(positive label) per answer token (see `aggregate_windows`)."""

    offsets: tuple[tuple[int, int], ...]  # character offsets into the answer
    probs: np.ndarray  # float32, one per answer token
    windows: int


class Detector:
    """Token classifier over (context + question, answer); only answer tokens are scored."""

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self._pos = model.manifest.positive_index

    def prepare(self, context: Sequence[str], question: str | None, answer: str) -> PairInput:
        m = self.model.manifest
        return detector_input(self.model.tokenizer, self.model.layout, m.template, context, question, answer, m.max_length, m.context_overlap)

    def finish(self, prepared: PairInput, row_probs: Sequence[np.ndarray]) -> TokenScores:
        pos = [p[:, self._pos] for p in row_probs]
        return TokenScores(prepared.second_offsets, aggregate_windows(prepared, pos), len(prepared.rows))

    def predict_batch(self, examples: Sequence[tuple[Sequence[str], str | None, str]]) -> list[TokenScores]:
        """Synchronous scoring of (context, question, answer) triples, rows batched together."""
        prepared = [self.prepare(c, q, a) for c, q, a in examples]
        flat = [r for p in prepared for r in p.rows]
        probs = self.model.infer(flat)
        out, i = [], 0
        for p in prepared:
            out.append(self.finish(p, probs[i : i + len(p.rows)]))
            i += len(p.rows)
        return out

    def predict(self, context: Sequence[str], question: str | None, answer: str) -> TokenScores:
        return self.predict_batch([(context, question, answer)])[0]


@dataclass(frozen=True, slots=True)
class NliResult:
    label: str  # entailment | neutral | contradiction
    confidence: float
    entailment: float  # max P(entailment) over premise windows (what the drop rule reads)


class Explainer:
    """NLI over (grounding context, sentence holding a span); long premises are windowed.

    Window aggregation: a claim is entailed if any premise window entails it
    (confidence = max P(entailment)); else contradicted if any window's top label
    is contradiction (confidence = max P(contradiction) among those windows);
    else neutral (max P(neutral)). A window that does not mention the claim
    says "neutral", so neutral must not outvote support or contradiction elsewhere.
    """

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        m = model.manifest
        self._idx = {k: m.label_index(k) for k in ("entailment", "neutral", "contradiction")}

    def prepare(self, context: Sequence[str], hypotheses: Sequence[str], max_windows: int = 0) -> list[PairInput]:
        m = self.model.manifest
        premise = "\n\n".join(p for p in context if p)
        return nli_inputs(self.model.tokenizer, self.model.layout, premise, hypotheses, m.max_length, m.context_overlap,
                          max_windows)

    def finish_one(self, probs: Sequence[np.ndarray]) -> NliResult:
        p = np.stack(probs)
        ent, neu, con = (p[:, self._idx[k]] for k in ("entailment", "neutral", "contradiction"))
        top = p.argmax(axis=1)
        if (top == self._idx["entailment"]).any():
            return NliResult("entailment", float(ent.max()), float(ent.max()))
        is_con = top == self._idx["contradiction"]
        if is_con.any():
            return NliResult("contradiction", float(con[is_con].max()), float(ent.max()))
        return NliResult("neutral", float(neu.max()), float(ent.max()))

    def finish(self, prepared: Sequence[PairInput], row_probs: Sequence[np.ndarray]) -> list[NliResult]:
        out, i = [], 0
        for pi in prepared:
            out.append(self.finish_one(row_probs[i : i + len(pi.rows)]))
            i += len(pi.rows)
        return out

    def predict_batch(self, context: Sequence[str], hypotheses: Sequence[str], max_windows: int = 0) -> list[NliResult]:
        prepared = self.prepare(context, hypotheses, max_windows)
        return self.finish(prepared, self.model.infer([r for p in prepared for r in p.rows]))


class Sentinel:
    """Sequence classifier: does this prompt need fact-checking?"""

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self._pos = model.manifest.positive_index

    def prepare(self, prompts: Sequence[str]) -> list[Row]:
        m = self.model.manifest
        return prompt_rows(self.model.tokenizer, self.model.layout, m.template, prompts, m.max_length)

    def finish(self, row_probs: Sequence[np.ndarray]) -> list[float]:
        return [float(p[self._pos]) for p in row_probs]

    def predict_batch(self, prompts: Sequence[str]) -> list[float]:
        """P(needs fact-check) per prompt."""
        return self.finish(self.model.infer(self.prepare(prompts)))
