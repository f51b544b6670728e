"""The serving path (engine build + detect + sentinel + explainer) must not import torch/transformers."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import asyncio, json, sys
from extproc.config import default_config
from extproc.inference.engine import EngineSettings, build_engine

async def main():
    engine = build_engine(EngineSettings.from_config(
        default_config(), sentinel_dir=sys.argv[1], detector_dir=sys.argv[2], explainer_dir=sys.argv[3], surrogate_dir=None,
        token_threshold=0.0, min_span_confidence=0.0, min_span_chars=1,
        nli_entailment_threshold=1.0))
    sentinel = await engine.classify_prompt("what is the dose?")
    result = await engine.detect(["Paris is the capital of France."], "capital?", "Lyon is the capital.")
    await engine.close()
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "onnx"))
    print(json.dumps({"heavy": heavy, "spans": len(result.spans), "nli": [s.nli_label for s in result.spans],
                      "sentinel": sentinel.confidence, "roles": [m.role for m in engine.models()]}))

asyncio.run(main())
"""


def test_serving_path_never_imports_torch_or_transformers(tiny_models):
    dirs = [str(tiny_models[k]) for k in ("bert-seq", "modernbert-token", "bert-nli")]
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *dirs], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["roles"] == ["sentinel", "detector", "explainer"]
    assert out["spans"] > 0 and all(label is not None for label in out["nli"])  # the whole path really ran
    assert out["heavy"] == []


SURROGATE_SCRIPT = r"""
import asyncio, json, sys
from extproc.config import default_config
from extproc.inference.engine import EngineSettings, build_engine

async def main():
    engine = build_engine(EngineSettings.from_config(default_config()))
    result = await engine.detect(["Paris is the capital of France."], "Capital?", "Lyon is the capital.")
    await engine.close()
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "onnx", "gguf"))
    print(json.dumps({"heavy": heavy, "signals": list(result.signals)}))

asyncio.run(main())
"""


def test_the_surrogate_lm_serves_without_torch_onnx_or_gguf():
    """The default config's surrogate (built by make setup-serve) reads answers with onnxruntime alone."""
    root = Path(__file__).resolve().parents[3]
    assert (root / "models/surrogate/model.onnx").is_file(), "make setup-dev builds models/surrogate"
    proc = subprocess.run([sys.executable, "-c", SURROGATE_SCRIPT], cwd=root, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["signals"] == ["detector", "verifier", "context_pmi"]  # the surrogate really ran
    assert out["heavy"] == []
