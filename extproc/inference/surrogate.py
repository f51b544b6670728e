"""The surrogate LM on the serving path: a small causal LM (ONNX, no torch) that reads answers.

A gateway does not own the upstream model, so the white-box signals are computed under a small
open model beside the detector. The served one is LUMINA's context reliance, as context PMI:
per answer token `log p(token | passages, question, earlier answer) - log p(token | question,
earlier answer)`. An answer the passages explain scores high; one the model would have written
without them, or that the passages make less likely, scores low. It needs no training. The same
passes also give LUMINA's logit-lens emergence, the MMD of next-token distributions under the real
vs other passages, and the pooled hidden states LatentAudit reads (`read`).

The directory is what `truthlens export --task causal-lm` writes (see `gguf_export`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from extproc.inference.gguf_export import TOKEN_EMBEDDINGS, CausalLmManifest
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
    emergence: float | None = None  # logit lens: `lens_emergence`
    mmd: float | None = None  # real vs other passages: mean `embedding_mmd` over answer tokens


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
        self.session = create_session(path / "model.onnx", options,
                                      int8=self.manifest.provenance.get("quantize") == "int8")
        self.provider = self.session.get_providers()[0]
        self._outputs = {o.name for o in self.session.get_outputs()}
        self._inputs = {i.name for i in self.session.get_inputs()}
        emb = path / TOKEN_EMBEDDINGS
        self.embeddings: np.ndarray | None = np.load(emb, mmap_mode="r") if emb.is_file() else None
        self.max_tokens = min(max_tokens, self.manifest.max_length)  # per pass: prompt + answer
        self.name = self.manifest.name

    def _prompt_ids(self, user: str) -> list[int]:
        ids = self.tokenizer.encode(self.manifest.chat.prompt(user), add_special_tokens=False).ids
        bos = self.manifest.bos_token_id
        return [bos, *ids] if bos is not None else list(ids)

    def _run(self, sequences: Sequence[Sequence[int]], outputs: Sequence[str], score_from: int = 0) -> list[np.ndarray]:
        """One padded batch; next-token outputs are computed from position `score_from` on (0 before it)."""
        width = max(len(s) for s in sequences)
        if width > self.manifest.max_length:
            raise ValueError(f"{width} tokens exceed the surrogate's max_length {self.manifest.max_length}")
        batch = np.zeros((len(sequences), width), dtype=np.int64)  # causal: padding on the right is never seen
        for i, s in enumerate(sequences):
            batch[i, : len(s)] = s
        feed = {"input_ids": batch}
        if "score_from" in self._inputs:  # graphs exported before the input existed score every position
            feed["score_from"] = np.array([max(0, min(score_from, width - 1))], dtype=np.int64)
        return self.session.run(list(outputs), feed)

    def token_logprobs(self, sequences: Sequence[Sequence[int]], score_from: int = 0) -> list[np.ndarray]:
        """log p(token t | tokens < t) per sequence (0 for t <= score_from); right-padded into one batch."""
        if not sequences:
            return []
        (out,) = self._run(sequences, ["token_logprobs"], score_from)
        return [out[i, : len(s)] for i, s in enumerate(sequences)]

    def context_pmi(self, context: Sequence[str], question: str | None, answer: str) -> TokenPmi:
        """Context PMI per answer token. Passages that do not fit keep their head; the question stays whole."""
        return self.read(context, question, answer).pmi

    def _passages(self, context: Sequence[str], room: int) -> tuple[str, int]:
        """The passages joined, cut to `room` tokens (their head kept); and their token count."""
        passages = "\n\n".join(c for c in context if c)
        p_ids = self.tokenizer.encode(passages, add_special_tokens=False).ids
        if len(p_ids) > max(room, 0):
            p_ids = p_ids[: max(room, 0)]
            passages = self.tokenizer.decode(p_ids)
        return passages, len(p_ids)

    def read(self, context: Sequence[str], question: str | None, answer: str, hidden: bool = False,
             lens: bool = False, other_context: Sequence[str] | None = None) -> SurrogateReading:
        """Context PMI; with `hidden` the grounded pass's hidden states pooled over the answer and the passages;
        with `lens` the logit lens on the answer tokens; with `other_context` (another request's passages) the
        MMD between the next-token distributions under the real and the other passages (a third pass)."""
        enc = self.tokenizer.encode(answer, add_special_tokens=False)
        answer_ids = list(enc.ids)[: self.max_tokens // 2]
        if not answer_ids:
            return SurrogateReading(TokenPmi((), ()), None)
        n = len(answer_ids)
        offsets = tuple((int(s), int(e)) for s, e in enc.offsets[:n])
        ask = question.strip() if question and question.strip() else None
        bare = self._prompt_ids(ask or NO_QUESTION_BARE)
        room = self.max_tokens - n - len(bare) - PROMPT_RESERVE
        passages, n_passage = self._passages(context, room)
        user = f"{passages}\n\n{ask or NO_QUESTION}"
        grounded = self._prompt_ids(user)
        mmd = other_context is not None and self.embeddings is not None
        names = ["token_logprobs"]
        names += ["hidden_states"] if hidden and self.manifest.hidden_layers else []
        names += ["lens_logprobs"] if lens and "lens_logprobs" in self._outputs else []
        names += ["topk_logprobs", "topk_ids"] if mmd else []
        # separate runs, not one padded batch: the bare prompt is a fraction of the grounded one
        out = dict(zip(names, self._run([grounded + answer_ids], names, len(grounded) - 1)))
        (without,) = self.token_logprobs([bare + answer_ids], len(bare) - 1)
        final = out["token_logprobs"][0, len(grounded):]
        diff = final - without[len(bare):]
        pooled = None
        if "hidden_states" in out:
            # where the passages sit in the grounded prompt: after the chat prefix of the user turn
            full = self.manifest.chat.prompt(user)
            start = len(self.tokenizer.encode(full[: full.index(user)], add_special_tokens=False).ids)
            start = min(start + (self.manifest.bos_token_id is not None), len(grounded) - 1)
            states = out["hidden_states"][:, 0]  # [layers, T, H]
            ev = states[:, start : start + max(n_passage, 1)]
            pooled = np.stack([states[:, len(grounded):].mean(axis=1), ev.mean(axis=1)], axis=1)  # [layers, 2, H]
        emergence = None
        if "lens_logprobs" in out:
            emergence = lens_emergence(out["lens_logprobs"][:, 0, len(grounded):], final)
        distance = None
        if mmd:
            assert other_context is not None and self.embeddings is not None
            other, _ = self._passages(other_context, room)
            shuffled = self._prompt_ids(f"{other}\n\n{ask or NO_QUESTION}")
            vals_o, ids_o = self._run([shuffled + answer_ids], ["topk_logprobs", "topk_ids"], len(shuffled) - 1)
            # the distributions that predict answer tokens: positions prompt-1 .. prompt+n-2
            g0, s0 = len(grounded) - 1, len(shuffled) - 1
            distance = float(np.mean(embedding_mmd(
                out["topk_logprobs"][0, g0 : g0 + n], out["topk_ids"][0, g0 : g0 + n],
                vals_o[0, s0 : s0 + n], ids_o[0, s0 : s0 + n], self.embeddings)))
        return SurrogateReading(TokenPmi(offsets, tuple(float(x) for x in diff)), pooled, emergence, distance)


def lens_emergence(lens_logprobs: np.ndarray, final_logprobs: np.ndarray) -> float:
    """LUMINA's information-processing signal via the logit lens: the mean probability the intermediate
    layers already give each answer token, relative to the final layer's (clipped to 1). High: the
    prediction emerges early, from the model's own knowledge; low: it forms late, as context is read."""
    lens_p = np.exp(np.asarray(lens_logprobs, dtype=np.float64))  # [layers, n]
    final_p = np.exp(np.asarray(final_logprobs, dtype=np.float64))  # [n]
    if lens_p.size == 0 or final_p.size == 0:
        return 0.0
    return float(np.mean(np.minimum(lens_p / np.maximum(final_p, 1e-12), 1.0)))


def embedding_mmd(p_logprobs: np.ndarray, p_ids: np.ndarray, q_logprobs: np.ndarray, q_ids: np.ndarray,
                  embeddings: np.ndarray) -> np.ndarray:
    """Per position, the MMD between two top-k next-token distributions under the cosine kernel of token
    embeddings: with unit embeddings e, MMD^2 = |sum_i p_i e_i - sum_j q_j e_j|^2 (probabilities renormalised
    over each top-k). 0: the passages did not change what the model expects; up to 2: disjoint directions."""
    def mean_embedding(logprobs: np.ndarray, ids: np.ndarray) -> np.ndarray:
        w = np.exp(logprobs - logprobs.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        e = embeddings[ids].astype(np.float32)  # [n, k, H]
        e /= np.linalg.norm(e, axis=-1, keepdims=True) + 1e-6
        return np.einsum("nk,nkh->nh", w, e)

    diff = mean_embedding(p_logprobs, p_ids) - mean_embedding(q_logprobs, q_ids)
    return np.sqrt(np.maximum((diff ** 2).sum(axis=-1), 0.0))
