"""The benchmark's synthetic contexts really have the token counts its results claim."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from bench.inference_bench import synthetic_text


@pytest.mark.parametrize("n", [1, 37, 256, 1024])
def test_synthetic_text_has_exact_token_count(tiny_models, n: int) -> None:  # type: ignore[no-untyped-def]
    for key in ("bert-token", "modernbert-token"):
        tok = Tokenizer.from_file(str(tiny_models[key] / "tokenizer.json"))
        text = synthetic_text(tok, n, seed=n)
        assert len(tok.encode(text, add_special_tokens=False).ids) == n
    assert synthetic_text(tok, 0) == ""
