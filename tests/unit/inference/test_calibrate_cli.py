"""`truthlens calibrate` on the real surrogate, and the sidecar loading (or refusing) what it wrote."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from extproc.inference.engine import LATENT_AUDIT, EngineSettings, build_engine
from extproc.inference.latent_audit import LatentAudit
from extproc.inference.manifest import ManifestError
from tests.helpers.settings import engine_settings

ROOT = Path(__file__).resolve().parents[3]
FACTS = [
    ("The Vellmar bridge opened in 1931 and spans 412 metres.", "When did the Vellmar bridge open?",
     "The Vellmar bridge opened in 1931.", "The Vellmar bridge opened in 1872 after a royal decree."),
    ("Orla Teague wrote the novel Salt Meridian in 2004.", "Who wrote Salt Meridian?",
     "Orla Teague wrote Salt Meridian.", "Salt Meridian was written by Henrik Osterby in 1990."),
    ("The Kessen river is 88 km long and flows into Lake Amber.", "How long is the Kessen river?",
     "The Kessen river is 88 km long.", "The Kessen river is about 500 km long and reaches the sea."),
    ("Dr. Mina Falk discovered the enzyme lumivase in 1967.", "Who discovered lumivase?",
     "Dr. Mina Falk discovered lumivase in 1967.", "Lumivase was discovered by a team at Oxford in 2011."),
]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    if not (ROOT / "models/surrogate/model.onnx").is_file():
        pytest.fail("models/surrogate is missing: `make setup-dev` builds it")
    tmp = tmp_path_factory.mktemp("calibrate")
    rows = []
    for i in range(3):  # the same facts asked three ways: 24 labelled answers
        for ctx, q, good, bad in FACTS:
            rows.append({"id": f"g{i}-{len(rows)}", "context": ctx, "question": q if i else None, "answer": good, "labels": []})
            rows.append({"id": f"b{i}-{len(rows)}", "context": ctx, "question": q if i else None, "answer": bad,
                         "labels": [{"start": 0, "end": len(bad)}]})
    data = tmp / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp / "calibration.npz"
    proc = subprocess.run([sys.executable, "-m", "extproc.cli", "calibrate", "--data", str(data), "--out", str(out),
                           "--surrogate", str(ROOT / "models/surrogate"), "--k", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["examples"] == 24 and report["hallucinated"] == 12
    assert report["fixed_point_agreement"] >= 0.995 and report["threshold"] > 0
    return out


def test_the_file_records_the_surrogate_and_its_layers(calibration):
    manifest = json.loads((ROOT / "models/surrogate/truthlens.json").read_text())
    audit = LatentAudit.load(calibration, model_sha256=manifest["provenance"]["gguf_sha256"])
    assert audit.layers == tuple(manifest["hidden_layers"]) and audit.matrix.shape[0] == 2
    assert np.isfinite(audit.matrix).all()


def _settings(**kw) -> EngineSettings:
    base = dict(sentinel_dir=None, detector_dir=str(ROOT / "models/detector"), explainer_dir=str(ROOT / "models/explainer"),
                surrogate_dir=str(ROOT / "models/surrogate"), provider="cpu")
    return engine_settings(**{**base, **kw})


async def test_the_sidecar_loads_it_and_refuses_one_for_another_surrogate(calibration, tmp_path):
    engine = build_engine(_settings(latent_audit_file=str(calibration), strict=True))
    try:
        assert engine.latent_audit is not None
        # the bundled calibration.json has no fit using it, so it is loaded but not in the score
        assert LATENT_AUDIT not in engine.signals
    finally:
        await engine.close()
    audit = LatentAudit.load(calibration)
    other = LatentAudit(audit.matrix, audit.offset, audit.threshold, "f" * 64, audit.layers).save(tmp_path / "other.npz")
    with pytest.raises(ManifestError, match="truthlens.signals.latent_audit.*another surrogate"):
        build_engine(_settings(latent_audit_file=str(other), strict=True))
    lenient = build_engine(_settings(latent_audit_file=str(other)))
    try:
        assert lenient.latent_audit is None and "another surrogate" in lenient.load_errors["latent_audit"]
    finally:
        await lenient.close()


def test_bad_data_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "x"}\n')
    proc = subprocess.run([sys.executable, "-m", "extproc.cli", "calibrate", "--data", str(bad), "--out",
                           str(tmp_path / "c.npz")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "bad.jsonl" in proc.stderr
