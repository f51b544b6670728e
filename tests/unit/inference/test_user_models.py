"""Bring-your-own model: an already-exported ONNX token classifier with a hand-written manifest
(the LettuceDetect recipe from docs/inference.md, on a tiny ModernBERT stand-in)."""

import json
import shutil

from extproc.inference.engine import build_engine
from extproc.inference.templates import LETTUCEDETECT_TEMPLATE
from tests.helpers.settings import engine_settings

HAND_WRITTEN = {
    "task": "token-classification",
    "labels": ["supported", "hallucinated"],
    "max_length": 448,  # the LettuceDetect prompt alone is ~170 tiny-BPE tokens
    "input_names": ["input_ids", "attention_mask"],
    "template": LETTUCEDETECT_TEMPLATE,
    "name": "lettucedetect-like",
}


async def test_hand_written_manifest_with_lettucedetect_template(tiny_models, tmp_path):
    d = tmp_path / "lettuce"
    d.mkdir()
    for f in ("model.onnx", "tokenizer.json"):  # what a user copies from an optimum/ONNX export
        shutil.copyfile(tiny_models["modernbert-token"] / f, d / f)
    (d / "truthlens.json").write_text(json.dumps(HAND_WRITTEN))
    engine = build_engine(engine_settings(detector_dir=str(d), provider="cpu", token_threshold=0.0,
                                         min_span_confidence=0.0, min_span_chars=1))
    try:
        (info,) = engine.models()
        assert info.name == "lettucedetect-like"
        det = engine.detector
        rows = det.prepare(["France is in Europe.", "Paris is its capital."], "What is the capital?", "Paris.").rows
        first = det.model.tokenizer.decode(list(rows[0].input_ids[: rows[0].second_start]))
        assert "passage 1: France is in Europe.\npassage 2: Paris is its capital." in first
        assert "following 2 passages" in first and "What is the capital?" in first
        answer = "The capital of France is Paris."
        result = await engine.detect(["France is in Europe. " * 30, "Paris is its capital."], "What is the capital?", answer)
        assert result.windows > 1 and result.spans
        assert result.spans[-1].end == len(answer)
    finally:
        await engine.close()


def test_template_that_leaves_no_room_is_rejected_at_load(tiny_models, tmp_path):
    import pytest

    from extproc.inference.manifest import ManifestError

    d = shutil.copytree(tiny_models["modernbert-token"], tmp_path / "small")
    (d / "truthlens.json").write_text(json.dumps({**HAND_WRITTEN, "max_length": 128}))
    with pytest.raises(ManifestError, match=r"truthlens\.models\.detector: .*template takes \d+ of max_length 128"):
        build_engine(engine_settings(detector_dir=str(d), provider="cpu", strict=True))
