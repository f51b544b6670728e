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


def test_auto_keeps_int8_graphs_on_the_cpu_unless_cuda_runs_their_float_twin(tiny_models, monkeypatch):
    """onnxruntime's CUDA provider runs int8 graphs' quantized ops on the CPU with copies around them (slower than
    the CPU alone on an H200, bench/results/inference-cuda.md): CUDA gets the float twin; when that does not run
    on CUDA (here: no GPU) or cannot be built, auto keeps the int8 graph on the CPU."""
    monkeypatch.setattr(runtime.ort, "get_available_providers", lambda: [CUDA, CPU])  # as on a GPU host
    twins: list[str] = []
    real = runtime._float_twin
    monkeypatch.setattr(runtime, "_float_twin", lambda p: (twins.append(p), real(p))[1])
    s = create_session(tiny_models["bert-seq"] / "model.onnx", RuntimeOptions("auto"), int8=True)
    assert s.get_providers() == [CPU] and twins == [str(tiny_models["bert-seq"] / "model.onnx")]
    monkeypatch.setattr(runtime, "_float_twin", lambda p: None)  # no onnx package: not even tried on CUDA
    assert create_session(tiny_models["bert-seq"] / "model.onnx", RuntimeOptions("auto"), int8=True).get_providers() == [CPU]


def test_models_tell_the_runtime_whether_their_graph_is_int8(tiny_models, monkeypatch, tmp_path):
    import json
    import shutil

    from extproc.inference import models

    seen: list[bool] = []
    real = models.create_session
    monkeypatch.setattr(models, "create_session", lambda path, opts, int8=False: (seen.append(int8), real(path, opts))[1])
    int8_dir = shutil.copytree(tiny_models["bert-seq"], tmp_path / "int8")
    manifest = json.loads((int8_dir / "truthlens.json").read_text())
    manifest.setdefault("provenance", {})["quantize"] = "int8"
    (int8_dir / "truthlens.json").write_text(json.dumps(manifest))
    float_dir = shutil.copytree(tiny_models["bert-seq"], tmp_path / "float")
    manifest["provenance"]["quantize"] = None
    (float_dir / "truthlens.json").write_text(json.dumps(manifest))
    models.OnnxModel(int8_dir, "sentinel", RuntimeOptions("cpu"))
    models.OnnxModel(float_dir, "sentinel", RuntimeOptions("cpu"))
    assert seen == [True, False]
