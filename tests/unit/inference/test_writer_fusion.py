"""Writer fusion (truthlens.signals.upstream_fusion): the response score stacked with the writer's own logprobs,
only for the upstream models a fit was made on; `truthlens fit-upstream` writes the file the sidecar loads."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from extproc.cli import main as cli
from extproc.config import parse_config
from extproc.gateway.wiring import StartupError, writer_fusion
from extproc.inference.api import DetectionResult
from extproc.inference.calibration import Calibration, CalibrationError, CalibrationSet
from extproc.inference.upstream import UpstreamSignals, WriterFusion

SURE = UpstreamSignals(tokens=5, mean_logprob=-0.1, min_logprob=-0.3, mean_entropy=None)
UNSURE = UpstreamSignals(tokens=5, mean_logprob=-1.5, min_logprob=-6.0, mean_entropy=1.2)


def _fit(**kw) -> Calibration:
    base = dict(a=1.0, b=0.0, raw_score="response", fitted_on={"upstream_models": ["llama-3-70b"]},
                signals={"upstream_min_logprob": -0.5})
    return Calibration(**{**base, **kw})


def test_a_fit_moves_only_its_own_writers_score_and_names_the_signal() -> None:
    fusion = WriterFusion({"llama-3-70b": _fit()})
    result = DetectionResult(score=0.5, spans=(), signals=("detector", "verifier"))
    sure, unsure = (fusion.fuse("llama-3-70b", result, s) for s in (SURE, UNSURE))
    assert sure.score == pytest.approx(1 / (1 + math.exp(-0.15)))  # logit(0.5) = 0, -0.5 x -0.3
    assert unsure.score == pytest.approx(1 / (1 + math.exp(-3.0))) and unsure.score > sure.score
    assert sure.signals == ("detector", "verifier", "upstream_min_logprob")
    assert fusion.fuse("gpt-4o", result, UNSURE) is result  # logprob scales are the writer's own
    assert fusion.fuse(None, result, UNSURE) is result and fusion.fuse("llama-3-70b", result, None) is result
    # a fit needing the entropy, on an answer whose upstream returned no alternatives: the score stays
    entropy = WriterFusion({"llama-3-70b": _fit(signals={"upstream_mean_entropy": 1.0})})
    assert entropy.fuse("llama-3-70b", result, SURE) is result
    assert entropy.fuse("llama-3-70b", result, UNSURE).score == pytest.approx(1 / (1 + math.exp(-1.2)))


@pytest.mark.parametrize("fit, message", [
    (_fit(raw_score="fused"), "stacks on 'fused'"),
    (_fit(fitted_on={}), "upstream_models"),
    (_fit(signals={"context_pmi": 1.0}), "not among"),
    (_fit(signals={}), "not among"),
])
def test_a_file_that_cannot_serve_is_refused_by_name(tmp_path: Path, fit: Calibration, message: str) -> None:
    path = CalibrationSet((fit,)).write(tmp_path / "fusion.json")
    with pytest.raises(CalibrationError, match=message):
        WriterFusion.load(path)
    twice = CalibrationSet((_fit(), _fit())).write(tmp_path / "twice.json")
    with pytest.raises(CalibrationError, match="second fit for upstream model 'llama-3-70b'"):
        WriterFusion.load(twice)
    cfg = parse_config({"truthlens": {"signals": {"upstream_fusion": str(path)}}})
    with pytest.raises(StartupError, match="^truthlens.signals.upstream_fusion: "):  # serve exits 2 with it
        writer_fusion(cfg)
    assert writer_fusion(parse_config({})) is None


def _rows(model: str, n: int, seed: int) -> list[dict]:
    """Answers whose writer was unsure (low min logprob) when it made things up, plus a noisy score."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        bad = i % 3 == 0
        rows.append({"model": model, "score": min(max(rng.gauss(0.6 if bad else 0.4, 0.2), 0.01), 0.99),
                     "upstream": {"mean_logprob": -0.5, "min_logprob": rng.gauss(-5.0 if bad else -1.0, 1.0),
                                  "mean_entropy": 0.5},
                     "hallucinated": bad})
    return rows


def test_fit_upstream_writes_per_writer_fits_the_sidecar_loads(tmp_path: Path, capsys) -> None:
    data = tmp_path / "labelled.jsonl"
    rows = _rows("writer-a", 90, 0) + _rows("writer-b", 10, 1)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "fusion.json"
    assert cli(["fit-upstream", "--data", str(data), "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["writer-b"]["fit"] is None  # 10 answers: too few, its score is left alone
    auc = report["writer-a"]["auroc_in_sample"]
    assert auc["fused"] > auc["score"] + 0.1  # the writer's doubt carries what the score misses
    fusion = WriterFusion.load(out)
    assert set(fusion.fits) == {"writer-a"} and fusion.fits["writer-a"].signals["upstream_min_logprob"] < 0
    assert "--data" in fusion.fits["writer-a"].fitted_on["command"]


def test_fit_upstream_refuses_bad_lines_by_number_and_writes_nothing_without_a_fit(tmp_path: Path, capsys) -> None:
    data, out = tmp_path / "labelled.jsonl", tmp_path / "fusion.json"
    data.write_text(json.dumps(_rows("w", 1, 0)[0]) + "\n" + json.dumps({"model": "w", "score": 0.5}) + "\n")
    assert cli(["fit-upstream", "--data", str(data), "--out", str(out)]) == 2
    assert "labelled.jsonl:2:" in capsys.readouterr().err and not out.exists()
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows("w", 12, 0)))
    assert cli(["fit-upstream", "--data", str(data), "--out", str(out)]) == 1 and not out.exists()
