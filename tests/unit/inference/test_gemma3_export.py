"""The Gemma 3 architecture in the GGUF exporter, checked against transformers on a tiny random model (#16).

A gemma3 GGUF is written here with random weights and a small SentencePiece vocabulary (characters
plus byte fallback), as llama.cpp's converter lays one out: norms stored as `w + 1`, Q/K in the
half-split layout, no chat template (as the pretrained Gemma 3 270M GGUF). Six layers, so the sixth is
a global layer and the others local ones with a 4-token sliding window and their own rope base; the
prompt is a few hundred tokens, so the window, the two rope tables, the q/k norms, the sandwich norms,
GeGLU, the embedding scale and the tied head all show in the logits. transformers loads the same
file (`Gemma3ForCausalLM` via `gguf_file=`), so both sides read identical dequantized weights.
"""

import numpy as np
import pytest

from extproc.inference.gguf_export import GEMMA_TURNS, export_gguf, parity_report, read_shape
from extproc.inference.runtime import RuntimeOptions
from extproc.inference.surrogate import SurrogateLM

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")

HIDDEN, FFN, HEADS, KV, LAYERS, HEAD_DIM, WINDOW = 16, 32, 2, 1, 6, 256, 4
CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
CHARS = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] \
    + list("0123456789.,;:?!'\"-()\n")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny_gemma")
    tokens = CONTROL + [f"<0x{b:02X}>" for b in range(256)] + CHARS
    types = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(CHARS)
    rng = np.random.default_rng(0)
    normal = lambda *shape, scale=0.3: (rng.normal(size=shape) * scale).astype(np.float32)  # noqa: E731
    stored_norm = lambda n: (1.0 + rng.uniform(-0.5, 0.5, size=n)).astype(np.float32)  # noqa: E731  (w + 1)
    path = tmp / "tiny-gemma3.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(LAYERS)
    w.add_context_length(1024)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_sliding_window(WINDOW)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.add_tensor("token_embd.weight", normal(len(tokens), HIDDEN, scale=1.0))  # tied: no output.weight
    w.add_tensor("output_norm.weight", stored_norm(HIDDEN))
    for i in range(LAYERS):
        for name, shape in (("attn_q", (HEADS * HEAD_DIM, HIDDEN)), ("attn_k", (KV * HEAD_DIM, HIDDEN)),
                            ("attn_v", (KV * HEAD_DIM, HIDDEN)), ("attn_output", (HIDDEN, HEADS * HEAD_DIM)),
                            ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)), ("ffn_down", (HIDDEN, FFN))):
            w.add_tensor(f"blk.{i}.{name}.weight", normal(*shape))
        for name, n in (("attn_norm", HIDDEN), ("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM),
                        ("post_attention_norm", HIDDEN), ("ffn_norm", HIDDEN), ("post_ffw_norm", HIDDEN)):
            w.add_tensor(f"blk.{i}.{name}.weight", stored_norm(n))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp / "model"
    manifest = export_gguf(path, out, hidden_layers=(0, 3, LAYERS), top_k=4, max_length=1024)
    return path, out, manifest


def test_gemma3_metadata_is_read_with_its_local_and_global_layers(tiny_gemma):
    path, _, manifest = tiny_gemma
    shape = read_shape(gguf.GGUFReader(str(path)))
    assert (shape.architecture, shape.head_dim, shape.sliding_window) == ("gemma3", HEAD_DIM, WINDOW)
    assert (shape.rope_base, shape.rope_local_base) == (1_000_000.0, 10_000.0)
    assert [shape.is_local(i) for i in range(LAYERS)] == [True] * 5 + [False]
    assert manifest.chat == GEMMA_TURNS  # no template in the file: Gemma's turn format
    assert manifest.bos_token_id == 2


def test_the_gemma3_graph_matches_transformers_on_the_same_gguf(tiny_gemma):
    path, out, _ = tiny_gemma
    report = parity_report(path, out)
    assert report["tokens"] > 8 * WINDOW  # long enough that the local layers' window cuts attention
    assert report["token_ids_equal"]  # the SentencePiece tokenizer.json is transformers' conversion
    assert report["logits_max_abs_diff"] < 1e-3 and report["token_logprobs_max_abs_diff"] < 1e-4
    # 0: the embeddings after Gemma's sqrt(hidden) scale; 6: after the final norm
    assert report["hidden_0_max_abs_diff"] < 1e-5 and report["hidden_6_max_abs_diff"] < 1e-4
    assert report["ok"]


def test_the_surrogate_serves_the_gemma3_export(tiny_gemma):
    _, out, _ = tiny_gemma
    lm = SurrogateLM(out, RuntimeOptions("cpu", 1), max_tokens=512)
    prompt = lm._prompt_ids("Who signed it?")
    assert prompt[0] == 2 and lm.tokenizer.id_to_token(prompt[1]) == "<start_of_turn>"  # BOS, then the turn token
    reading = lm.read(["The treaty was signed in 1642 by Duke Aldric."], "Who signed it?", "Duke Aldric did.")
    assert len(reading.pmi.pmi) == len(reading.pmi.offsets) > 0
    assert all(np.isfinite(reading.pmi.pmi))
