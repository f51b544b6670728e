import logging

import pytest

from extproc.inference import runtime
from extproc.inference.runtime import CPU, CUDA, ProviderUnavailable, RuntimeOptions, create_session


def test_cpu_provider_and_thread_counts_reach_the_session(tiny_models):
    s = create_session(tiny_models["bert-seq"] / "model.onnx", RuntimeOptions("cpu", intra_op_threads=1, inter_op_threads=1))
    assert s.get_providers() == [CPU]
    opts = s.get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)


def test_auto_uses_cuda_only_when_the_session_reports_it(tiny_models, caplog, monkeypatch):
    monkeypatch.setattr(runtime, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="extproc.inference.runtime"):
        a = create_session(tiny_models["bert-seq"] / "model.onnx", RuntimeOptions("auto"))
        b = create_session(tiny_models["bert-token"] / "model.onnx", RuntimeOptions("auto"))
    if CUDA in a.get_providers():
        assert not caplog.records
    else:
        assert a.get_providers()[0] == CPU and b.get_providers()[0] == CPU
        assert len([r for r in caplog.records if "CUDA not usable" in r.message]) == 1  # one warning, not one per model


def test_explicit_cuda_fails_loudly_when_cuda_cannot_run(tiny_models):
    try:
        s = create_session(tiny_models["bert-seq"] / "model.onnx", RuntimeOptions("cuda"))
    except ProviderUnavailable as exc:
        assert "provider 'cuda' requested" in str(exc)
    else:
        assert s.get_providers()[0] == CUDA


def test_unknown_provider_names_the_key(tiny_models):
    with pytest.raises(ValueError, match="truthlens.models.provider"):
        create_session(tiny_models["bert-seq"] / "model.onnx", RuntimeOptions("tpu"))
