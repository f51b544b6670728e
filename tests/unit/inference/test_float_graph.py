"""float_graph: the float twin of an int8 encoder graph computes the original model with int8-rounded weights
(activations unquantized), so it sits closer to the float model than the int8 graph does, with no quantized
op left for CUDA to send back to the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from extproc.inference.float_graph import FloatGraphError, float_graph, float_graph_bytes
from tests.helpers.tiny_models import build_model_dir

QUANTIZED = {"DynamicQuantizeLinear", "MatMulInteger", "QAttention", "QEmbedLayerNormalization"}
REPO = Path(__file__).resolve().parents[3]


def _logits(graph: str | bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    s = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    return s.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in s.get_inputs()}})[0]


def test_the_twin_of_a_fused_int8_export_is_closer_to_the_float_model(tmp_path: Path) -> None:
    int8_dir, _ = build_model_dir("bert-token", tmp_path / "int8", quantize="int8", optimize=True)
    fp32_dir, _ = build_model_dir("bert-token", tmp_path / "fp32", optimize=True)  # same seed: the same weights
    int8 = onnx.load(str(int8_dir / "model.onnx"))
    assert {n.op_type for n in int8.graph.node} & {"QAttention", "QEmbedLayerNormalization", "MatMulInteger"}
    twin = float_graph(int8)
    ops = {n.op_type for n in twin.graph.node}
    assert not ops & QUANTIZED and "DequantizeLinear" in ops
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(5, 90, size=(2, 40)).astype(np.int64),
             "attention_mask": np.ones((2, 40), np.int64), "token_type_ids": np.zeros((2, 40), np.int64)}
    feeds["attention_mask"][1, 25:] = 0
    ref = _logits(str(fp32_dir / "model.onnx"), feeds)
    mask = feeds["attention_mask"].astype(bool)
    twin_err = np.abs(_logits(twin.SerializeToString(), feeds) - ref)[mask].max()
    int8_err = np.abs(_logits(str(int8_dir / "model.onnx"), feeds) - ref)[mask].max()
    assert twin_err < int8_err and twin_err < 0.05  # weight rounding only; the int8 graph also rounds activations

    # RuntimeOptions.float_twins: the CPU runs the twin, so CUDA's scores can be measured without a GPU
    from extproc.inference.runtime import RuntimeOptions, create_session

    for provider in ("cpu", "auto"):  # auto on this CPU-only build falls back to the CPU, twins kept
        session = create_session(int8_dir / "model.onnx", RuntimeOptions(provider, float_twins=True), int8=True)
        on_cpu = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]
        np.testing.assert_allclose(on_cpu, _logits(twin.SerializeToString(), feeds), atol=1e-5)
    plain = create_session(int8_dir / "model.onnx", RuntimeOptions("cpu"), int8=True)
    assert not np.allclose(plain.run(None, {i.name: feeds[i.name] for i in plain.get_inputs()})[0],
                           _logits(twin.SerializeToString(), feeds), atol=1e-5)


@pytest.mark.parametrize("name", ["detector", "explainer", "sentinel"])
def test_the_shipped_int8_models_have_a_twin_that_runs(name: str) -> None:
    path = REPO / "models" / name / "model.onnx"
    twin = float_graph_bytes(path)
    assert not {n.op_type for n in onnx.load_from_string(twin).graph.node} & QUANTIZED
    n = 64
    feeds = {"input_ids": np.full((1, n), 2000, np.int64), "attention_mask": np.ones((1, n), np.int64),
             "token_type_ids": np.zeros((1, n), np.int64)}
    out = _logits(twin, feeds)
    assert out.shape[0] == 1 and np.isfinite(out).all()


def test_an_unknown_quantized_layout_is_refused_by_name() -> None:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])
    w = helper.make_tensor("w", TensorProto.INT8, [2, 2], [1, 2, 3, 4])
    node = helper.make_node("MatMulInteger", ["x", "w"], ["y"], name="lonely")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]))
    with pytest.raises(FloatGraphError, match="x: not the output of DynamicQuantizeLinear|lonely"):
        float_graph(model)
