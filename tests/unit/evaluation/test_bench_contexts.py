"""The benchmark's synthetic contexts really have the token counts its results claim."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tokenizers import Tokenizer

BENCH = Path(__file__).resolve().parents[3] / "bench" / "inference_bench.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("inference_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n", [1, 37, 256, 1024])
def test_synthetic_text_has_exact_token_count(tiny_models, n: int) -> None:  # type: ignore[no-untyped-def]
    bench = _bench()
    for key in ("bert-token", "modernbert-token"):
        tok = Tokenizer.from_file(str(tiny_models[key] / "tokenizer.json"))
        text = bench.synthetic_text(tok, n, seed=n)
        assert len(tok.encode(text, add_special_tokens=False).ids) == n
    assert bench.synthetic_text(tok, 0) == ""
