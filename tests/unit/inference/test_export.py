import json

import numpy as np
import onnx
import pytest

from extproc.cli import main
from extproc.inference.manifest import load_manifest
from extproc.inference.models import Detector, OnnxModel, Sentinel
from extproc.inference.runtime import RuntimeOptions
from tests.helpers.tiny_models import build_checkpoint, build_model_dir

CPU = RuntimeOptions("cpu")


def _dims(path):
    graph = onnx.load(str(path)).graph
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


@pytest.mark.parametrize("key", ["bert-token", "modernbert-token", "bert-seq", "modernbert-seq", "bert-nli",
                                 "mpnet-token"])
def test_export_has_parity_dynamic_axes_and_the_right_inputs(tiny_models, key):
    path = tiny_models[key]
    report = tiny_models.reports[key]
    assert report["ok"] and report["fp32_max_abs_diff"] < 1e-4
    manifest = load_manifest(path)
    assert manifest.provenance["parity"]["fp32_max_abs_diff"] == report["fp32_max_abs_diff"]
    dims = _dims(path / "model.onnx")
    expected = {"input_ids", "attention_mask"} | ({"token_type_ids"} if key.startswith("bert") else set())
    assert set(dims) == expected == set(manifest.input_names)
    assert all(all(isinstance(d, str) for d in shape) for shape in dims.values())  # batch and sequence are symbolic


def test_bert_export_builds_tokenizer_json_from_vocab_txt(tiny_models):
    hf = tiny_models.root / "bert-token-hf"
    assert (hf / "vocab.txt").exists() and not (hf / "tokenizer.json").exists()
    assert (tiny_models["bert-token"] / "tokenizer.json").exists()


@pytest.mark.parametrize("key", ["modernbert-token", "mpnet-token"])
def test_exported_graph_runs_batches_of_other_shapes(tiny_models, key):
    det = Detector(OnnxModel(tiny_models[key], "detector", CPU))
    out = det.predict_batch([(["one two"], None, "three"), (["paris is the capital " * 40], "what", "lyon is")])
    assert [len(x.probs) for x in out] == [len(x.offsets) for x in out]
    assert out[1].windows > 1  # the long context took the windowing path


def test_fusing_an_architecture_the_optimizer_does_not_know_fails_naming_it(tmp_path):
    with pytest.raises(ValueError, match="'mpnet'"):
        build_model_dir("mpnet-token", tmp_path, quantize="int8", optimize=True)


@pytest.mark.parametrize("mode", ["int8", "fp16"])
def test_quantized_and_fp16_exports_load_and_report_parity(tmp_path, mode):
    kwargs = {"quantize": "int8"} if mode == "int8" else {"fp16": True}
    out, report = build_model_dir("bert-seq", tmp_path, **kwargs)
    assert "final_max_abs_diff" in report and np.isfinite(report["final_max_abs_diff"])
    assert report["final_max_abs_diff"] < 0.5
    manifest = load_manifest(out)
    assert manifest.provenance["quantize" if mode == "int8" else "fp16"] in ("int8", True)
    (p,) = Sentinel(OnnxModel(out, "sentinel", CPU)).predict_batch(["what is the dose?"])
    assert 0.0 <= p <= 1.0


def test_cli_export_prints_the_parity_report(tmp_path, capsys):
    hf = build_checkpoint("modernbert", "token", tmp_path / "hf")
    template = json.dumps({"first": "Question: {question}\n{context}", "second": "{answer}"})
    rc = main(["export", "--from", str(hf), "--task", "token-classification", "--out", str(tmp_path / "out"),
               "--max-length", "96", "--template", template, "--exporter", "dynamo"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"] and report["input_names"] == ["input_ids", "attention_mask"]
    manifest = load_manifest(tmp_path / "out")
    assert manifest.max_length == 96 and manifest.template["first"].startswith("Question:")
    assert "dynamo" in manifest.provenance["exporter"]


def test_cli_export_rejects_a_bad_checkpoint(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    rc = main(["export", "--from", str(tmp_path / "hf"), "--task", "nli", "--out", str(tmp_path / "out")])
    assert rc == 1 and "export failed" in capsys.readouterr().err


def test_optimized_int8_export_fuses_attention_keeps_parity_and_serves(tmp_path):
    import onnx

    out, report = build_model_dir("bert-token", tmp_path, quantize="int8", optimize=True)
    assert report["ok"] and report["optimized_max_abs_diff"] < 1e-3  # fusion itself is exact up to float error
    assert np.isfinite(report["final_max_abs_diff"]) and report["final_max_abs_diff"] < 0.5
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert ops & {"Attention", "QAttention"}, ops
    assert load_manifest(out).provenance["optimized"]
    det = Detector(OnnxModel(out, "detector", CPU))
    (scores,) = det.predict_batch([(["paris is the capital of france"], "what?", "lyon is the capital")])
    assert len(scores.probs) == len(scores.offsets) > 0


def test_optimize_refuses_models_its_fusions_do_not_cover(tmp_path, capsys):
    hf = build_checkpoint("modernbert", "token", tmp_path / "hf")
    rc = main(["export", "--from", str(hf), "--task", "token-classification", "--out", str(tmp_path / "out"),
               "--quantize", "int8", "--optimize"])
    assert rc == 1 and "optimize supports model types ['bert']" in capsys.readouterr().err
