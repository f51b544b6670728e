"""LatentAudit: Ledoit-Wolf and Youden against closed forms, the Mahalanobis scorer, fixed point, the file."""

import numpy as np
import pytest

from extproc.evaluation.metrics import auroc
from extproc.inference.latent_audit import (
    AuditError,
    FixedPointAudit,
    LatentAudit,
    audit_features,
    decision_agreement,
    fit_latent_audit,
    ledoit_wolf,
    youden_threshold,
)


def _ledoit_wolf_by_the_paper(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Ledoit & Wolf (2004), Lemma 3.2-3.4 written with explicit loops (the normalised Frobenius norm /p)."""
    n, p = x.shape
    xc = x - x.mean(axis=0)
    s = sum(np.outer(r, r) for r in xc) / n
    m = np.trace(s) / p
    d2 = np.sum((s - m * np.eye(p)) ** 2) / p
    b2_bar = sum(np.sum((np.outer(r, r) - s) ** 2) / p for r in xc) / n ** 2
    b2 = min(b2_bar, d2)
    return (b2 / d2) * m * np.eye(p) + (1 - b2 / d2) * s, b2 / d2


def test_ledoit_wolf_matches_the_paper_formula():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 6)) @ rng.normal(size=(6, 6))
    cov, shrink = ledoit_wolf(x)
    ref_cov, ref_shrink = _ledoit_wolf_by_the_paper(x)
    assert shrink == pytest.approx(ref_shrink, rel=1e-9) and 0 < shrink < 1
    assert np.allclose(cov, ref_cov)


def test_ledoit_wolf_closed_cases():
    # two mirrored samples: both outer products equal S, so S has no sampling variance and is kept as it is
    x = np.array([[1.0, 2.0, 0.0, -1.0], [-1.0, -2.0, 0.0, 1.0]])
    cov, shrink = ledoit_wolf(x)
    assert shrink == 0.0 and np.allclose(cov, np.outer(x[0], x[0]))
    # three samples on two axes of three: the formula gives 4/7 (computed by hand with the paper's lemmas)
    spikes = np.array([[3.0, 0.0, 0.0], [-3.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    cov, shrink = ledoit_wolf(spikes)
    assert shrink == pytest.approx(4 / 7)
    assert np.allclose(cov, _ledoit_wolf_by_the_paper(spikes)[0])
    # already a multiple of the identity: nothing to shrink
    iso = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    cov, shrink = ledoit_wolf(iso)
    assert shrink == 0.0 and np.allclose(cov, 0.5 * np.eye(2))
    with pytest.raises(AuditError):
        ledoit_wolf(np.ones((1, 3)))


def test_youden_threshold_closed_cases():
    # separable: J = 1 from 0.8 up; the cut sits halfway to the next lower score
    assert youden_threshold([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == pytest.approx(0.5)
    scores, labels = [0.1, 0.3, 0.5, 0.9, 0.2], [False, False, True, True, True]
    # cuts: 0.1 -> 1-1=0; 0.2 -> 1-0.5=0.5; 0.3 -> 2/3-0.5; 0.5 -> 2/3-0=0.667; 0.9 -> 1/3
    assert youden_threshold(scores, labels) == pytest.approx(0.4)  # J peaks at 0.5; halfway down to 0.3
    with pytest.raises(AuditError, match="both classes"):
        youden_threshold([0.1, 0.2], [True, True])


def _data(seed=0, n=600, d=40):
    rng = np.random.default_rng(seed)
    y = rng.uniform(size=n) < 0.4
    x = rng.normal(size=(n, d))
    x[y, :3] += 1.5  # unfaithful answers drift along three directions
    x[y, 3] *= 3.0
    return x, y


def test_mahalanobis_distance_ranks_the_drifted_class_and_is_the_whitened_norm():
    x, y = _data()
    audit = fit_latent_audit(x, y, model_sha256="a" * 64, layers=(10, 20), k=4)
    d = np.array([audit.distance(v) for v in x])
    assert auroc(d, y) > 0.8
    assert audit.fitted_on["k"] == 4 and 0.0 <= audit.fitted_on["ledoit_wolf_shrinkage"] <= 1.0
    # distance^2 is a quadratic form: the matrix is the whitening of the faithful projections
    v = x[0]
    y0 = audit.matrix @ v + audit.offset
    assert audit.distance(v) == pytest.approx(float(np.sqrt(y0 @ y0)))
    flagged = d >= audit.threshold
    assert flagged[y].mean() > flagged[~y].mean() + 0.4


def test_fixed_point_decisions_agree_with_float(tmp_path):
    x, y = _data(seed=1)
    x[:, 5] *= 300.0  # one feature with a far larger range, as hidden states have
    audit = fit_latent_audit(x, y, model_sha256="a" * 64, layers=(10,), k=8)
    fixed = FixedPointAudit.from_float(audit, input_range=np.abs(x).max(axis=0))
    assert fixed.weights.dtype == np.int16
    assert decision_agreement(audit, fixed, x) >= 0.995


def test_file_round_trip_and_another_surrogate_is_refused(tmp_path):
    x, y = _data(seed=2)
    audit = fit_latent_audit(x, y, model_sha256="a" * 64, layers=(10, 20), k=4, data="unit")
    path = audit.save(tmp_path / "calibration.npz")
    back = LatentAudit.load(path, model_sha256="a" * 64)
    assert np.allclose(back.matrix, audit.matrix) and back.threshold == audit.threshold
    assert back.layers == (10, 20) and back.fitted_on["data"] == "unit"
    with pytest.raises(AuditError, match="another surrogate"):
        LatentAudit.load(path, model_sha256="b" * 64)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(AuditError, match="bad.npz"):
        LatentAudit.load(tmp_path / "bad.npz")


def test_features_are_answer_minus_evidence_per_layer():
    hidden = np.arange(2 * 2 * 3, dtype=np.float64).reshape(2, 2, 3)  # [layers, (answer, evidence), H]
    assert audit_features(hidden).tolist() == [-3.0, -3.0, -3.0, -3.0, -3.0, -3.0]
    with pytest.raises(AuditError):
        audit_features(np.zeros((2, 3, 4)))
