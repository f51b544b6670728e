"""Upstream logprobs on the wire: asked for, read, and cut out of the bytes with nothing else changed."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.inference.upstream import entropy, upstream_signals
from extproc.protocol.logprobs import (
    TokenLogprob,
    ask_for_logprobs,
    choice_logprobs,
    strip_choice_logprobs,
    strip_event_logprobs,
)

LOGPROBS = {"content": [{"token": "a\"}{\\", "logprob": -0.25, "top_logprobs": [{"token": "b", "logprob": -1.5}]}]}
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(extra=st.dictionaries(st.sampled_from(["message", "finish_reason", "delta", "x"]), text, max_size=3),
       at=st.integers(0, 4), n=st.integers(1, 3), indent=st.sampled_from([None, 0, 1, 2]),
       compact=st.booleans(), lp=st.sampled_from([LOGPROBS, None, {"content": []}]))
def test_cutting_logprobs_leaves_every_other_byte(extra, at, n, indent, compact, lp) -> None:
    """The body equals what the upstream would have sent without logprobs, in its own spelling."""
    def body(with_lp: bool) -> bytes:
        choices = []
        for i in range(n):
            members = [("index", i), *extra.items()]
            if with_lp:
                members.insert(min(at, len(members)), ("logprobs", lp))
            choices.append(dict(members))
        seps = (",", ":") if compact and indent is None else None
        return json.dumps({"id": "x", "choices": choices, "usage": {"t": 1}}, indent=indent, separators=seps).encode()
    assert strip_choice_logprobs(body(True)) == body(False)


def test_only_choice_level_logprobs_go_and_bad_input_stays() -> None:
    raw = b'{"logprobs": 1, "choices": [{"index": 0, "logprobs": null, "x": {"logprobs": 2}}]}'
    assert strip_choice_logprobs(raw) == b'{"logprobs": 1, "choices": [{"index": 0, "x": {"logprobs": 2}}]}'
    assert strip_choice_logprobs(b'{"choices": [{"logprobs": ') == b'{"choices": [{"logprobs": '
    assert strip_choice_logprobs(b"[1, 2]") == b"[1, 2]"


def test_an_event_loses_its_logprobs_only() -> None:
    ev = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]}}]}\r\n\r\n'
    assert strip_event_logprobs(ev) == b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\r\n\r\n'
    assert strip_event_logprobs(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"


def test_asking_adds_the_fields_unless_the_client_asked() -> None:
    asked = json.loads(ask_for_logprobs(b'{"model": "m", "messages": []}', 3))
    assert (asked["logprobs"], asked["top_logprobs"]) == (True, 3)
    assert ask_for_logprobs(b'{"logprobs": true, "messages": []}', 3) is None
    assert "top_logprobs" not in json.loads(ask_for_logprobs(b"{}", 0))


def test_tokens_are_read_per_choice() -> None:
    obj = {"choices": [{"index": 1, "logprobs": LOGPROBS}, {"index": 0, "logprobs": None}, "junk"]}
    assert choice_logprobs(obj) == {1: [TokenLogprob(-0.25, (-1.5,))]}


def test_signals_against_closed_forms() -> None:
    assert entropy([math.log(0.5), math.log(0.5)]) == math.log(2)
    assert entropy([0.0]) == 0.0
    s = upstream_signals([(-0.1, (-0.1, -2.0)), (-0.5, ()), (float("-inf"), ())])
    assert s.tokens == 2 and s.mean_logprob == -0.3 and s.min_logprob == -0.5  # -inf dropped
    p = [math.exp(-0.1), math.exp(-2.0)]
    q = [x / sum(p) for x in p]
    assert math.isclose(s.mean_entropy, -sum(x * math.log(x) for x in q))  # only tokens with alternatives count
    assert upstream_signals([]) is None
