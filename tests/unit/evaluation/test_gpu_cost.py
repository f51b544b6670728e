"""bench.gpu_cost: the torch stand-in of the surrogate graph computes what the served graph reads, and a
measurement over tiny shapes fills every row of the report (the GPU run itself happens on a lent machine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench import gpu_cost  # noqa: E402


@pytest.fixture()
def tiny_configs(tmp_path: Path) -> Path:
    bert = {"model_type": "bert", "vocab_size": 1200, "hidden_size": 16, "num_attention_heads": 2,
            "intermediate_size": 32, "max_position_embeddings": 512, "num_hidden_layers": 6}
    mpnet = {**bert, "model_type": "mpnet", "max_position_embeddings": 514, "num_hidden_layers": 12}
    llama = {"name": "tiny", "vocab": 300, "hidden": 16, "heads": 2, "kv_heads": 1, "intermediate": 32,
             "layers": 21, "rope_base": 10000.0, "rms_eps": 1e-5, "hidden_layers": [10, 20, 21]}
    for name, cfg in (("minilm", bert), ("mpnet", mpnet), ("surrogate", llama)):
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
    return tmp_path


def test_surrogate_pass_matches_next_token_logprobs(tiny_configs: Path) -> None:
    lm = gpu_cost.surrogate(tiny_configs, "cpu", torch.float32)
    ids = np.random.default_rng(1).integers(0, 300, size=(1, 12), dtype=np.int64)
    out = gpu_cost.surrogate_pass(lm, ids, 4, "cpu", lens=True, hidden=True, topk=True)
    with torch.inference_mode():
        logp = torch.log_softmax(lm(input_ids=torch.from_numpy(ids)).logits, -1)[0].numpy()
    expected = [logp[t - 1, ids[0, t]] for t in range(5, 12)]  # tokens after score_from, each from its prefix
    np.testing.assert_allclose(out["token_logprobs"][0], expected, atol=1e-4)
    assert out["lens_logprobs"].shape == (2, 1, 7)  # the intermediate exported layers 10 and 20
    assert out["hidden_states"].shape == (3, 1, 12, 16)
    assert out["topk_ids"].shape == (1, 7, gpu_cost.TOP_K) and np.all(np.diff(out["topk_logprobs"], axis=-1) <= 0)


def test_measure_fills_every_row(tiny_configs: Path) -> None:
    result = gpu_cost.measure(tiny_configs, "cpu", runs=1)
    assert len(result["encoders"]) == len(gpu_cost.ENCODERS) * 2  # 1 and 8 rows, fp32 only on CPU
    assert len(result["surrogate"]) == 5
    assert all(v["p50_ms"] > 0 for part in ("encoders", "surrogate") for v in result[part].values())
    text = gpu_cost.report(result, "cmd")
    assert "| mpnet-12 (quality tier) | fp32 | 8 |" in text and "| all four | fp32 |" in text
