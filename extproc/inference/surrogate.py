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

    def token_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """log p(token t | tokens < t) per sequence (first token 0); right-padded into one batch."""
        if not sequences:
            return []
        width = max(len(s) for s in sequences)
        if width > self.manifest.max_length:
            raise ValueError(f"{width} tokens exceed the surrogate's max_length {self.manifest.max_length}")
        batch = np.zeros((len(sequences), width), dtype=np.int64)  # causal: padding on the right is never seen
        for i, s in enumerate(sequences):
            batch[i, : len(s)] = s
        (out,) = self.session.run(["token_logprobs"], {"input_ids": batch})
        return [out[i, : len(s)] for i, s in enumerate(sequences)]

    def context_pmi(self, context: Sequence[str], question: str | None, answer: str) -> TokenPmi:
        """Context PMI per answer token. Passages that do not fit keep their head; the question stays whole."""
        enc = self.tokenizer.encode(answer, add_special_tokens=False)
        answer_ids = list(enc.ids)[: self.max_tokens // 2]
        if not answer_ids:
            return TokenPmi((), ())
        offsets = tuple((int(s), int(e)) for s, e in enc.offsets[: len(answer_ids)])
        ask = question.strip() if question and question.strip() else None
        bare = self._prompt_ids(ask or NO_QUESTION_BARE)
        room = self.max_tokens - len(answer_ids) - len(bare) - PROMPT_RESERVE
        passages = "\n\n".join(c for c in context if c)
        p_ids = self.tokenizer.encode(passages, add_special_tokens=False).ids
        if len(p_ids) > max(room, 0):
            passages = self.tokenizer.decode(p_ids[: max(room, 0)])
        grounded = self._prompt_ids(f"{passages}\n\n{ask or NO_QUESTION}")
        # two runs, not one padded batch: the bare prompt is a fraction of the grounded one
        (with_ctx,) = self.token_logprobs([grounded + answer_ids])
        (without,) = self.token_logprobs([bare + answer_ids])
        diff = with_ctx[len(grounded):] - without[len(bare):]
        return TokenPmi(offsets, tuple(float(x) for x in diff))
