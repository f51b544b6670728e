"""A tiny GGUF written here, exported, and the white-box signals checked against hand computation.

The model's attention and MLP weights are zero, so each hidden state is just the current token's
embedding: the model is a bigram table `log_softmax(rms(E[cur]) * g @ H.T)` that cannot read the
context. By hand, then: every token log-prob is that table's entry; context PMI is 0 (the passages
change nothing); the MMD between the next-token distributions under two different contexts is 0;
and the logit lens at the middle layer already predicts exactly what the last layer does
(emergence 1).
"""

import numpy as np
import pytest

from extproc.inference.gguf_export import export_gguf
from extproc.inference.runtime import RuntimeOptions
from extproc.inference.surrogate import SurrogateLM, embedding_mmd, lens_emergence

gguf = pytest.importorskip("gguf")

HIDDEN, FFN, HEADS, KV, LAYERS = 8, 16, 2, 1, 2
SPECIAL = ["<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: the 256 base tokens of a byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    tokens = _byte_tokens() + SPECIAL
    vocab = len(tokens)
    rng = np.random.default_rng(0)
    embed = rng.normal(size=(vocab, HIDDEN)).astype(np.float32)
    head = rng.normal(size=(vocab, HIDDEN)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, size=HIDDEN).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp / "tiny.gguf"), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges([])
    w.add_token_types([1] * 256 + [3] * len(SPECIAL))
    w.add_chat_template(TEMPLATE)
    w.add_tensor("token_embd.weight", embed)
    w.add_tensor("output.weight", head)
    w.add_tensor("output_norm.weight", norm)
    hd = HIDDEN // HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (KV * hd, HIDDEN)), ("attn_v", (KV * hd, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                            ("ffn_down", (HIDDEN, FFN))):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp / "model"
    export_gguf(tmp / "tiny.gguf", out, hidden_layers=(1, LAYERS), top_k=4, max_length=256)
    x = embed / np.sqrt((embed ** 2).mean(axis=1, keepdims=True) + 1e-5) * norm
    logits = x @ head.T
    table = logits - np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)) \
        - logits.max(axis=1, keepdims=True)
    return SurrogateLM(out, RuntimeOptions("cpu", 1), max_tokens=200), table


def test_the_export_is_readable_by_older_onnxruntime(tiny):
    """IR 8 (opset 17), not the onnx package's own default: onnx 1.23 writes IR 14, which onnxruntime-gpu 1.31.1
    (the CUDA image's) refuses."""
    import onnx

    lm, _ = tiny
    assert onnx.load(str(lm.path / "model.onnx"), load_external_data=False).ir_version == 8


def test_token_log_probs_are_the_hand_computed_bigram_table(tiny):
    lm, table = tiny
    ids = lm.tokenizer.encode("The treaty was signed in 1642.").ids
    (got,) = lm.token_logprobs([ids])
    expected = [0.0] + [table[ids[t - 1], ids[t]] for t in range(1, len(ids))]
    assert np.allclose(got, expected, atol=1e-4)


def test_a_model_that_cannot_read_context_has_zero_context_signals(tiny):
    lm, _ = tiny
    reading = lm.read(["The treaty was signed in 1642 by Duke Aldric."], "Who signed it?", "Duke Aldric did.",
                      hidden=True, lens=True, other_context=["Bananas grow in warm places."])
    assert len(reading.pmi.pmi) == len("Duke Aldric did.")  # one byte-level token per character
    assert np.allclose(reading.pmi.pmi, 0.0, atol=1e-4)  # the passages change no prediction
    assert reading.mmd == pytest.approx(0.0, abs=1e-3)  # nor does swapping them for other passages
    assert reading.emergence == pytest.approx(1.0, abs=1e-4)  # layer 1 already predicts what layer 2 does
    assert reading.hidden.shape == (2, 2, HIDDEN)


def test_lens_emergence_and_mmd_by_hand():
    # final p = 0.5 for both tokens; the lens layer gives 0.25 and 0.5 -> ratios 0.5 and 1 -> mean 0.75
    assert lens_emergence(np.log([[0.25, 0.5]]), np.log([0.5, 0.5])) == pytest.approx(0.75)
    assert lens_emergence(np.log([[0.9]]), np.log([0.3])) == pytest.approx(1.0)  # clipped: never above 1
    emb = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])  # token 2 points the same way as token 0
    one = np.log(np.array([[1.0, 1e-9]]))
    # all mass on orthogonal tokens 0 vs 1: |e0 - e1| = sqrt(2)
    assert embedding_mmd(one, np.array([[0, 1]]), one, np.array([[1, 0]]), emb)[0] == pytest.approx(np.sqrt(2), abs=1e-3)
    # token 0 vs token 2: the same direction under the cosine kernel -> 0
    assert embedding_mmd(one, np.array([[0, 1]]), one, np.array([[2, 1]]), emb)[0] == pytest.approx(0.0, abs=1e-3)
    # half/half on (0, 1) vs all on 0: |(e0 + e1)/2 - e0| = sqrt(0.5)
    half = np.log(np.array([[0.5, 0.5]]))
    assert embedding_mmd(half, np.array([[0, 1]]), one, np.array([[0, 1]]), emb)[0] == pytest.approx(np.sqrt(0.5), abs=1e-3)
