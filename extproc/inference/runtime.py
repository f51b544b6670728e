"""onnxruntime sessions: provider choice, thread counts, input checks, padding.

`auto` trusts only what a created session reports: onnxruntime-gpu installs on
CPU-only machines and silently falls back to CPU, so `get_available_providers()`
says nothing about whether CUDA will actually run. An int8 graph does not go to CUDA
as it is: onnxruntime's CUDA provider runs its quantized ops on the CPU, with copies
to and from the GPU around them, measured slower than the CPU alone
(bench/results/inference-cuda.md). Its float twin (`float_graph`, built in memory
at load when the `onnx` package is installed) runs there instead; without `onnx`,
`auto` keeps the int8 graph on the CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from extproc.inference.manifest import MODEL_FILE, Manifest, ManifestError
from extproc.inference.windowing import Row

log = logging.getLogger(__name__)

PROVIDERS = ("auto", "cuda", "cpu")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_ORT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    provider: str = "auto"  # auto | cuda | cpu
    intra_op_threads: int = 0  # 0 = onnxruntime default
    inter_op_threads: int = 1
    float_twins: bool = False  # int8 graphs as their float twins on the CPU too: CUDA's scores, measured on a CPU


class ProviderUnavailable(RuntimeError):
    """provider: cuda was asked for, but the session did not get CUDA."""


def _session_options(opts: RuntimeOptions) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(0, opts.intra_op_threads)
    so.inter_op_num_threads = max(0, opts.inter_op_threads)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The sidecar shares its cores with Envoy, the event loop and gRPC threads: idle pool threads
    # that spin between batches steal exactly the CPU those need under concurrency.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


def cuda_available() -> bool:
    """This onnxruntime build has the CUDA provider (whether a GPU takes a session is known only once one is made)."""
    return CUDA in ort.get_available_providers()


def create_session(model_path: str | Path, opts: RuntimeOptions, int8: bool = False) -> ort.InferenceSession:
    """A session on the configured provider; `auto` falls back to CPU with one warning. An `int8` graph (its
    manifest's provenance says quantize: int8) goes to CUDA as its float twin, or stays on the CPU under `auto`."""
    if opts.provider not in PROVIDERS:
        raise ValueError(f"truthlens.models.provider: {opts.provider!r} is not one of {list(PROVIDERS)}")
    so = _session_options(opts)
    path = str(model_path)
    if opts.provider == "cpu":
        return _cpu_session(path, so, int8 and opts.float_twins)
    if opts.provider == "auto" and not cuda_available():
        session = _cpu_session(path, so, int8 and opts.float_twins)  # CPU-only build
    else:
        graph: str | bytes = path
        if int8:
            twin = _float_twin(path)
            if twin is None and opts.provider == "auto":
                return _cpu_session(path, so, opts.float_twins)
            if twin is None:
                _once("int8-on-cuda", logging.WARNING, "provider cuda with an int8 graph and no float twin (%s): its "
                      "quantized ops run on the CPU with copies around them, slower than provider cpu", path)
            graph = path if twin is None else twin
        session = ort.InferenceSession(graph, sess_options=so, providers=[CUDA, CPU])
        if int8 and CUDA not in session.get_providers() and opts.provider == "auto":
            session = _cpu_session(path, so, opts.float_twins)  # the int8 graph is faster there
    if CUDA in session.get_providers():
        return session
    if opts.provider == "cuda":
        raise ProviderUnavailable(
            f"{path}: provider 'cuda' requested but the session runs on {session.get_providers()} "
            "(is onnxruntime-gpu installed with matching CUDA/cuDNN libraries?)"
        )
    _warn_cpu_fallback(session.get_providers())
    return session


def _cpu_session(path: str, so: ort.SessionOptions, twin: bool) -> ort.InferenceSession:
    """A CPU session on the graph at `path`, or (`twin`: RuntimeOptions.float_twins) on its float twin."""
    graph = _float_twin(path) if twin else path
    if graph is None:
        raise RuntimeError(f"{path}: float_twins asked for, but no float twin could be built (see the log)")
    return ort.InferenceSession(graph, sess_options=so, providers=[CPU])


_warned = False
_said: set[str] = set()


def _warn_cpu_fallback(providers: list[str]) -> None:
    """provider auto without CUDA: say so once per process, not once per model."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("provider auto: CUDA not usable, running on CPU (session providers: %s)", providers)


def _float_twin(path: str) -> bytes | None:
    """The float twin of an int8 graph for CUDA, serialized; None (said once) when it cannot be built."""
    try:
        from extproc.inference.float_graph import float_graph_bytes

        return float_graph_bytes(path)
    except ImportError:
        _once("no-onnx", logging.WARNING, "no float twins of int8 graphs for CUDA: building them needs the onnx "
              "package (pip install onnx; the CUDA image has it)")
    except Exception as exc:  # noqa: BLE001 - an unknown graph layout: the int8 graph serves as before
        _once(f"twin-{path}", logging.WARNING, "%s: no float twin for CUDA (%s); the int8 graph is used", path, exc)
    return None


def _once(key: str, level: int, message: str, *args: object) -> None:
    """A provider note once per process, not once per model."""
    if key not in _said:
        _said.add(key)
        log.log(level, message, *args)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    input_names: tuple[str, ...]
    input_types: dict[str, type]
    output_name: str
    provider: str


def check_session(session: ort.InferenceSession, manifest: Manifest, where: str) -> SessionInfo:
    """The graph's real inputs must be exactly the manifest's input_names (ModernBERT has no token_type_ids)."""
    inputs = {i.name: i for i in session.get_inputs()}
    graph_names = set(inputs)
    declared = set(manifest.input_names)
    if graph_names != declared:
        raise ManifestError(
            f"{where}: manifest input_names {sorted(declared)} but {MODEL_FILE} takes {sorted(graph_names)}"
        )
    types = {}
    for name, meta in inputs.items():
        if meta.type not in _ORT_TYPES:
            raise ManifestError(f"{where}: input {name} has type {meta.type}; expected int64 or int32")
        if len(meta.shape) != 2:
            raise ManifestError(f"{where}: input {name} has shape {meta.shape}; expected [batch, sequence]")
        types[name] = _ORT_TYPES[meta.type]
    outputs = [o.name for o in session.get_outputs()]
    if manifest.output_name not in outputs:
        raise ManifestError(f"{where}: manifest output_name {manifest.output_name!r} not in graph outputs {outputs}")
    return SessionInfo(tuple(manifest.input_names), types, manifest.output_name, session.get_providers()[0])


def pad_rows(
    rows: Sequence[Row], input_names: Sequence[str], pad_id: int, dtypes: dict[str, type] | None = None
) -> dict[str, np.ndarray]:
    """Right-pad rows to the longest one; feeds only the inputs the graph has."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    types = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        n = len(r)
        ids[i, :n] = r.input_ids
        mask[i, :n] = 1
        types[i, :n] = r.type_ids
    all_feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    dtypes = dtypes or {}
    return {n: all_feeds[n].astype(dtypes.get(n, np.int64), copy=False) for n in input_names}


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities over the last axis; a single output column is read as a sigmoid logit."""
    logits = logits.astype(np.float32, copy=False)
    if logits.shape[-1] == 1:
        p = 1.0 / (1.0 + np.exp(-logits))
        return np.concatenate([1.0 - p, p], axis=-1)
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)
