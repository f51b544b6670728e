"""The surrogate LM on the serving path: a small causal LM (ONNX, no torch) that reads answers.

A gateway does not own the upstream model, so the white-box signals are computed under a small
open model beside the detector. The first signal is LUMINA's context reliance, as context PMI:
per answer token `log p(token | passages, question, earlier answer) - log p(token | question,
earlier answer)`. An answer the passages explain scores high; one the model would have written
without them, or that the passages make less likely, scores low. It needs no training.

The directory is what `truthlens export --task causal-lm` writes (see `gguf_export`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from extproc.inference.gguf_export import CausalLmManifest
from extproc.inference.runtime import RuntimeOptions, create_session

NO_QUESTION = "Write a response based on the text above."
NO_QUESTION_BARE = "Write a response."
PROMPT_RESERVE = 16  # tokens kept free for the chat markup around the passages


@dataclass(frozen=True, slots=True)
class TokenPmi:
    """Per answer token PMI (nats) with character offsets into the answer."""

    offsets: tuple[tuple[int, int], ...]
    pmi: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.pmi) / len(self.pmi) if self.pmi else 0.0


@dataclass(frozen=True, slots=True)
class SurrogateReading:
    """What one read of an answer gives: context PMI, and optionally pooled hidden states."""

    pmi: TokenPmi
    hidden: np.ndarray | None  # [layers, 2, H]: mean over answer tokens, mean over passage tokens (grounded pass)


class SurrogateLM:
    """One ONNX causal LM; `context_pmi` costs two forward passes (with and without the passages)."""

    def __init__(self, directory: str | Path, options: RuntimeOptions, max_tokens: int = 1024) -> None:
        path = Path(directory)
        for part in ("model.onnx", "tokenizer.json", "truthlens.json"):
            if not (path / part).is_file():
                raise FileNotFoundError(f"surrogate model directory {path} lacks {part} "
                                        "(build it with `truthlens export --task causal-lm`)")
        self.manifest = CausalLmManifest.from_json(json.loads((path / "truthlens.json").read_text(encoding="utf-8")),
                                                   str(path / "truthlens.json"))
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.path = path
        self.session = create_session(path / "model.onnx", options)
        self.provider = self.session.get_providers()[0]
        self.max_tokens = min(max_tokens, self.manifest.max_length)  # per pass: prompt + answer
        self.name = self.manifest.name

    def _prompt_ids(self, user: str) -> list[int]:
        ids = self.tokenizer.encode(self.manifest.chat.prompt(user), add_special_tokens=False).ids
        bos = self.manifest.bos_token_id
        return [bos, *ids] if bos is not None else list(ids)

    def _run(self, sequences: Sequence[Sequence[int]], outputs: Sequence[str]) -> list[np.ndarray]:
        width = max(len(s) for s in sequences)
        if width > self.manifest.max_length:
            raise ValueError(f"{width} tokens exceed the surrogate's max_length {self.manifest.max_length}")
        batch = np.zeros((len(sequences), width), dtype=np.int64)  # causal: padding on the right is never seen
        for i, s in enumerate(sequences):
            batch[i, : len(s)] = s
        return self.session.run(list(outputs), {"input_ids": batch})

    def token_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """log p(token t | tokens < t) per sequence (first token 0); right-padded into one batch."""
        if not sequences:
            return []
        (out,) = self._run(sequences, ["token_logprobs"])
        return [out[i, : len(s)] for i, s in enumerate(sequences)]

    def context_pmi(self, context: Sequence[str], question: str | None, answer: str) -> TokenPmi:
        """Context PMI per answer token. Passages that do not fit keep their head; the question stays whole."""
        return self.read(context, question, answer).pmi

    def read(self, context: Sequence[str], question: str | None, answer: str, hidden: bool = False) -> SurrogateReading:
        """Context PMI, and with `hidden` the grounded pass's hidden states pooled over the answer and the passages."""
        enc = self.tokenizer.encode(answer, add_special_tokens=False)
        answer_ids = list(enc.ids)[: self.max_tokens // 2]
        if not answer_ids:
            return SurrogateReading(TokenPmi((), ()), None)
        offsets = tuple((int(s), int(e)) for s, e in enc.offsets[: len(answer_ids)])
        ask = question.strip() if question and question.strip() else None
        bare = self._prompt_ids(ask or NO_QUESTION_BARE)
        room = self.max_tokens - len(answer_ids) - len(bare) - PROMPT_RESERVE
        passages = "\n\n".join(c for c in context if c)
        p_ids = self.tokenizer.encode(passages, add_special_tokens=False).ids
        if len(p_ids) > max(room, 0):
            p_ids = p_ids[: max(room, 0)]
            passages = self.tokenizer.decode(p_ids)
        user = f"{passages}\n\n{ask or NO_QUESTION}"
        grounded = self._prompt_ids(user)
        # two runs, not one padded batch: the bare prompt is a fraction of the grounded one
        names = ["token_logprobs", "hidden_states"] if hidden and self.manifest.hidden_layers else ["token_logprobs"]
        out = self._run([grounded + answer_ids], names)
        (without,) = self.token_logprobs([bare + answer_ids])
        diff = out[0][0, len(grounded):] - without[len(bare):]
        pooled = None
        if len(out) > 1:
            # where the passages sit in the grounded prompt: after the chat prefix of the user turn
            full = self.manifest.chat.prompt(user)
            start = len(self.tokenizer.encode(full[: full.index(user)], add_special_tokens=False).ids)
            start = min(start + (self.manifest.bos_token_id is not None), len(grounded) - 1)
            states = out[1][:, 0]  # [layers, T, H]
            ev = states[:, start : start + max(len(p_ids), 1)]
            pooled = np.stack([states[:, len(grounded):].mean(axis=1), ev.mean(axis=1)], axis=1)  # [layers, 2, H]
        return SurrogateReading(TokenPmi(offsets, tuple(float(x) for x in diff)), pooled)
