"""Hugging Face checkpoint -> TruthLens model directory (the only torch user).

Imported lazily by `truthlens export` and the training scripts; the serving
path never imports this module. The TorchScript exporter (`dynamo=False`) is
the default: on torch 2.13 it exports BERT/MiniLM and ModernBERT with dynamic
batch and sequence axes in about a second with ~1e-6 parity, while the dynamo
exporter gives the same parity but takes ~10x longer; it is kept as a fallback.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from extproc.inference.manifest import (
    DEFAULT_TEMPLATES,
    MODEL_FILE,
    NLI_LABELS,
    TOKENIZER_FILE,
    Manifest,
    ManifestError,
    manifest_from_dict,
)

# Conventional label names when a checkpoint only carries LABEL_0..LABEL_n.
DEFAULT_LABELS = {
    "token-classification": ["supported", "hallucinated"],  # LettuceDetect: 0 supported, 1 hallucinated
    "sequence-classification": ["no_check", "needs_check"],
}
# Role names accepted as task names (training scripts think in roles).
TASK_ALIASES = {"sentinel": "sequence-classification", "detector": "token-classification", "explainer": "nli"}
PARITY_SAMPLES = [
    ("Paris is the capital of France. It has 2.1 million inhabitants.", "The capital of France is Paris."),
    ("The Eiffel Tower was finished in 1889 for the World's Fair.", "It was built in 1925 by Gustave."),
    # long enough (~300 tokens) to cross ModernBERT's 128-token local-attention window
    ("Water boils at 100 degrees Celsius at sea level. " * 30, "Water boils at 90 degrees."),
]


def _labels_from_config(config: Any, task: str) -> list[str]:
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    labels = [id2label[i].lower() for i in sorted(id2label)]
    generic = all(x.startswith("label_") for x in labels)
    if task == "nli":
        if generic or not set(NLI_LABELS) <= set(labels):
            raise ManifestError(f"nli export: config labels {labels} do not name {list(NLI_LABELS)}; pass labels=")
        return labels
    if generic:
        return DEFAULT_LABELS[task][: len(labels)] if len(labels) == 2 else labels
    return labels


def _load_tokenizer_json(hf_dir: Path, out_dir: Path) -> None:
    """Copy tokenizer.json, or build it from the checkpoint's fast tokenizer (vocab.txt only)."""
    src = hf_dir / TOKENIZER_FILE
    if src.is_file():
        shutil.copyfile(src, out_dir / TOKENIZER_FILE)
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ManifestError(f"{hf_dir}: no tokenizer.json and no fast tokenizer could be built")
    backend.save(str(out_dir / TOKENIZER_FILE))


def _input_names(model: Any) -> list[str]:
    params = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in params and getattr(model.config, "type_vocab_size", 0) > 1:
        names.append("token_type_ids")
    return names


class _Wrapper:
    """Positional-argument forward returning logits only (what ONNX sees)."""

    @staticmethod
    def build(model: Any, names: Sequence[str]) -> Any:
        import torch

        has_types = "token_type_ids" in names

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
                kw = {"input_ids": input_ids, "attention_mask": attention_mask}
                if has_types:
                    kw["token_type_ids"] = token_type_ids
                return self.model(**kw).logits

        return Wrapped().eval()


def _sample_batch(tokenizer_path: Path, manifest: Manifest, n_rows: int | None = None) -> dict[str, np.ndarray]:
    """Padded sample rows built with the serving code's own layout (uneven lengths)."""
    from tokenizers import Tokenizer

    from extproc.inference.windowing import prepare_tokenizer, probe_layout, single_row, window_pair

    tok = prepare_tokenizer(Tokenizer.from_file(str(tokenizer_path)))
    layout = probe_layout(tok)
    rows = []
    for first, second in PARITY_SAMPLES[: n_rows or len(PARITY_SAMPLES)]:
        a = tok.encode(first, add_special_tokens=False).ids
        b = tok.encode(second, add_special_tokens=False).ids
        if manifest.task == "sequence-classification":
            rows.append(single_row(layout, a + b, manifest.max_length))
        else:
            rows.append(window_pair(layout, (), a, (), b, min(manifest.max_length, 384), 16)[0])
    from extproc.inference.runtime import pad_rows

    return pad_rows(rows, manifest.input_names, manifest.pad_token_id or 0)


def _torch_logits(wrapped: Any, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return wrapped(*[torch.from_numpy(feeds[n]) for n in names]).float().numpy()


def _onnx_logits(path: Path, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))[0].astype(np.float32)


def _max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray, task: str) -> float:
    if task == "token-classification":
        return float(np.abs(a - b)[mask.astype(bool)].max())
    return float(np.abs(a - b).max())


def _torch_export(wrapped: Any, feeds: Mapping[str, np.ndarray], names: Sequence[str], path: Path, opset: int, exporter: str) -> str:
    import contextlib
    import sys

    import torch

    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    with contextlib.redirect_stdout(sys.stderr):  # the dynamo exporter prints progress; stdout is the report
        _torch_export_quiet(wrapped, args, names, path, opset, exporter)
    return exporter


def _torch_export_quiet(wrapped: Any, args: tuple, names: Sequence[str], path: Path, opset: int, exporter: str) -> None:
    import torch

    if exporter == "legacy":
        axes = {n: {0: "batch", 1: "sequence"} for n in names}
        axes["logits"] = {0: "batch", 1: "sequence"}
        torch.onnx.export(
            wrapped, args, str(path), input_names=list(names), output_names=["logits"],
            dynamic_axes=axes, opset_version=opset, dynamo=False,
        )
    else:
        batch, seq = torch.export.Dim("batch", max=4096), torch.export.Dim("sequence", max=65536)
        torch.onnx.export(
            wrapped, args, str(path), input_names=list(names), output_names=["logits"],
            dynamic_shapes=tuple({0: batch, 1: seq} for _ in names), opset_version=max(opset, 18), dynamo=True,
            external_data=False,
        )


def export_model(
    hf_dir: str | Path,
    task: str,
    out_dir: str | Path,
    quantize: str | None = None,
    fp16: bool = False,
    labels: Sequence[str] | None = None,
    template: Mapping[str, str] | None = None,
    max_length: int | None = None,
    provenance: Mapping[str, Any] | None = None,
    positive_label: str | None = None,
    name: str | None = None,
    context_overlap: int | None = None,
    opset: int = 17,
    exporter: str = "legacy",
    tolerance: float = 1e-3,
    per_channel: bool = False,
    optimize: bool = False,
) -> dict[str, Any]:
    """Export `hf_dir` into `out_dir` (model.onnx + tokenizer.json + truthlens.json).

    `per_channel` (int8 only, opt-in) quantizes weights with one scale per output channel:
    ~0.1 MB larger for a MiniLM, closer to fp32 (the sentinel's dev accuracy gains ~0.3 pt).

    `optimize` (BERT-family only, opt-in) runs onnxruntime's transformer optimizer on the fp32
    graph before quantizing: attention, embedding and layer-norm subgraphs become fused
    com.microsoft ops (CPU and CUDA providers run them). For a 2-layer MiniLM detector a
    512-token window dropped from ~22 to ~19 ms on 2 cores; the parity check covers the result.

    Returns the parity report (also stored under manifest provenance.parity):
    max |onnx - torch| over real (unpadded) positions for the fp32 graph and,
    when quantized or fp16, for the final graph.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    task = TASK_ALIASES.get(task, task)
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', not {quantize!r}")
    if quantize and fp16:
        raise ValueError("choose one of quantize=int8 and fp16")
    if per_channel and quantize != "int8":
        raise ValueError("per_channel applies only to quantize='int8'")
    if optimize and fp16:
        raise ValueError("optimize applies to fp32 and int8 exports")
    if exporter not in ("legacy", "dynamo"):
        raise ValueError(f"exporter must be 'legacy' or 'dynamo', not {exporter!r}")
    if task not in DEFAULT_TEMPLATES:
        raise ValueError(f"task must be one of {list(DEFAULT_TEMPLATES)} (or {list(TASK_ALIASES)}), not {task!r}")
    config = AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)
    if optimize and getattr(config, "model_type", "") not in OPTIMIZABLE:
        raise ValueError(f"optimize supports model types {sorted(OPTIMIZABLE)}, not {getattr(config, 'model_type', None)!r}")
    cls = AutoModelForTokenClassification if task == "token-classification" else AutoModelForSequenceClassification
    model = cls.from_pretrained(str(hf_dir), local_files_only=True, attn_implementation="eager").eval()
    names = _input_names(model)
    label_list = [x.lower() for x in labels] if labels else _labels_from_config(config, task)
    if len(label_list) != model.config.num_labels:
        raise ManifestError(f"{len(label_list)} labels given but the checkpoint has {model.config.num_labels} outputs")
    positions = int(getattr(config, "max_position_embeddings", 512))
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        positions -= 2  # these reserve two positions for the padding offset
    length = int(max_length or min(positions, 8192))
    if length > positions:
        raise ManifestError(f"max_length {length} exceeds the model's {positions} positions")
    out_dir.mkdir(parents=True, exist_ok=True)
    _load_tokenizer_json(hf_dir, out_dir)
    manifest_data: dict[str, Any] = {
        "name": name or out_dir.name,
        "task": task,
        "labels": label_list,
        "max_length": length,
        "input_names": names,
        "template": dict(template or DEFAULT_TEMPLATES[task]),
    }
    if context_overlap is not None:  # else the manifest default, min(64, max_length // 4)
        manifest_data["context_overlap"] = context_overlap
    if positive_label:
        manifest_data["positive_label"] = positive_label
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int):
        manifest_data["pad_token_id"] = pad
    manifest = manifest_from_dict(manifest_data, where="export")
    wrapped = _Wrapper.build(model, names)
    feeds = _sample_batch(out_dir / TOKENIZER_FILE, manifest)
    ref = _torch_logits(wrapped, feeds, names)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        trace = _sample_batch(out_dir / TOKENIZER_FILE, manifest, n_rows=2)  # other shape than `feeds`
        try:
            used = _torch_export(wrapped, trace, names, fp32, opset, exporter)
        except Exception as exc:  # noqa: BLE001 - fall back to the other exporter, then give up loudly
            other = "dynamo" if exporter == "legacy" else "legacy"
            try:
                used = _torch_export(wrapped, trace, names, fp32, opset, other)
            except Exception:
                raise RuntimeError(f"ONNX export failed with both exporters; first error: {exc}") from exc
        parity: dict[str, Any] = {"fp32_max_abs_diff": _max_diff(_onnx_logits(fp32, feeds), ref, feeds["attention_mask"], task)}
        final = out_dir / MODEL_FILE
        if optimize:
            fp32 = _fuse_transformer(fp32, config)
            parity["optimized_max_abs_diff"] = _max_diff(_onnx_logits(fp32, feeds), ref, feeds["attention_mask"], task)
        if quantize == "int8":
            from onnx import TensorProto
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # Fused com.microsoft ops defeat ONNX shape inference: weights are float, say so.
            quantize_dynamic(str(fp32), str(final), weight_type=QuantType.QInt8, per_channel=per_channel,
                             extra_options={"DefaultTensorType": TensorProto.FLOAT})
        elif fp16:
            import onnx
            from onnxruntime.transformers.float16 import convert_float_to_float16

            onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(final))
        else:
            shutil.copyfile(fp32, final)
        if quantize or fp16 or optimize:
            parity["final_max_abs_diff"] = _max_diff(_onnx_logits(final, feeds), ref, feeds["attention_mask"], task)
    parity["samples"] = int(feeds["input_ids"].shape[0])
    parity["ok"] = parity["fp32_max_abs_diff"] <= tolerance
    parity["tolerance"] = tolerance
    manifest_data["provenance"] = {
        **dict(provenance or {}),
        "source": str(hf_dir),
        "model_type": getattr(config, "model_type", None),
        "architectures": getattr(config, "architectures", None),
        "exporter": f"torch.onnx ({used})",
        "opset": opset if used == "legacy" else max(opset, 18),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "quantize": quantize,
        **({"per_channel": True} if per_channel else {}),
        **({"optimized": "onnxruntime.transformers bert fusions"} if optimize else {}),
        "fp16": fp16,
        "exported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "parity": parity,
    }
    manifest_from_dict(manifest_data, where="export").write(out_dir)
    return {"out_dir": str(out_dir), "task": task, "labels": label_list, "input_names": names, "max_length": length, **parity}


OPTIMIZABLE = {"bert"}  # onnxruntime's "bert" fusion patterns match these exports (MiniLM included)


def _fuse_transformer(fp32: Path, config: Any) -> Path:
    """fp32 graph -> the same graph with fused attention / embedding / layer-norm ops."""
    from onnxruntime.transformers.optimizer import optimize_model

    out = fp32.with_name("fused.onnx")
    opt = optimize_model(str(fp32), model_type="bert", num_heads=int(config.num_attention_heads),
                         hidden_size=int(config.hidden_size), opt_level=1, use_gpu=False)
    if not opt.get_fused_operator_statistics().get("Attention"):
        raise RuntimeError("optimize: no attention block was fused; export without --optimize")
    opt.save_model_to_file(str(out))
    return out


def report_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
