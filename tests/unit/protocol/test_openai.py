"""Chat-completions parsing and mutation over real request/response shapes."""

from __future__ import annotations

import codecs
import json

import pytest

from extproc.protocol.openai import (
    ProtocolError,
    append_to_choices,
    content_text,
    error_body,
    parse_chat_request,
    parse_chat_response,
)


def _req(messages, **extra) -> bytes:
    return json.dumps({"model": "gpt-x", "messages": messages, **extra}).encode()


def test_all_roles_question_system_and_context():
    body = _req(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Cite sources."}]},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                    "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Paris is the capital of France."},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "Population 2.1M."}]},
            {"role": "user", "content": "What is the capital?"},
        ],
        tools=[{"type": "function", "function": {"name": "f"}}],
        stream=True,
    )
    req = parse_chat_request(body)
    assert req.model == "gpt-x"
    assert req.stream is True
    assert req.question == "What is the capital?"
    assert req.system_prompt == "Be brief.\n\nCite sources."
    assert req.context == ("Paris is the capital of France.", "Population 2.1M.")
    assert req.has_tools and req.has_tool_results and req.grounded
    assert req.messages_count == 7
    assert req.upstream_body is None  # no extension field: forward the original bytes


def test_array_content_joins_text_parts_and_counts_images():
    body = _req([{"role": "user", "content": [
        {"type": "text", "text": "Describe"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
        {"type": "text", "text": "this picture"},
    ]}])
    req = parse_chat_request(body)
    assert req.question == "Describe\nthis picture"
    assert req.non_text_parts == 2


def test_tools_without_results_give_no_grounding():
    body = _req([{"role": "user", "content": "weather?"}], tools=[{"type": "function", "function": {"name": "w"}}])
    req = parse_chat_request(body)
    assert req.has_tools and not req.has_tool_results
    assert req.context == () and not req.grounded


def test_rag_field_becomes_passages_and_is_removed_upstream():
    original = {
        "model": "gpt-x",
        "temperature": 0.25,
        "messages": [{"role": "tool", "tool_call_id": "t", "content": "tool says A"},
                     {"role": "user", "content": "Q?"}],
        "truthlens_context": ["doc one", {"text": "doc two"}, {"content": [{"type": "text", "text": "doc three"}]}, ""],
        "metadata": {"k": "v"},
    }
    req = parse_chat_request(json.dumps(original).encode())
    assert req.context == ("tool says A", "doc one", "doc two", "doc three")
    assert req.rag_documents == 3
    assert req.upstream_body is not None
    upstream = json.loads(req.upstream_body)
    expected = dict(original)
    del expected["truthlens_context"]
    assert upstream == expected
    assert list(upstream) == list(expected)  # key order kept


def test_rag_field_name_is_configurable_and_string_form_works():
    body = _req([{"role": "user", "content": "Q"}], my_docs="single document")
    req = parse_chat_request(body, rag_field="my_docs")
    assert req.context == ("single document",)
    assert "my_docs" not in json.loads(req.upstream_body)
    # the default field name is not looked at when another one is configured
    req2 = parse_chat_request(_req([{"role": "user", "content": "Q"}], truthlens_context="x"), rag_field="my_docs")
    assert req2.context == () and req2.upstream_body is None
    # None turns the convention off: the field is neither read nor removed
    req3 = parse_chat_request(_req([{"role": "user", "content": "Q"}], truthlens_context="x"), rag_field=None)
    assert req3.context == () and req3.upstream_body is None


@pytest.mark.parametrize("bad", [{"x": 1}, 5, [{"title": "no text"}]])
def test_malformed_rag_field_names_the_field(bad):
    with pytest.raises(ProtocolError, match="truthlens_context"):
        parse_chat_request(_req([{"role": "user", "content": "Q"}], truthlens_context=bad))


@pytest.mark.parametrize(
    "body,needle",
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1,2]", "JSON object"),
        (b'{"model":"m"}', "messages"),
        (b'{"messages":[]}', "messages"),
        (b'{"messages":"hi"}', "messages"),
        (b'{"messages":[1]}', "messages[0]"),
        (b'{"messages":[{"content":"x"}]}', "messages[0].role"),
        (b'{"messages":[{"role":"user","content":7}]}', "messages[0].content"),
        (b'{"messages":[{"role":"user","content":[3]}]}', "messages[0].content[0]"),
    ],
)
def test_bad_requests_raise_clear_errors(body, needle):
    with pytest.raises(ProtocolError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_chat_request(body)


def test_question_is_none_without_user_text():
    req = parse_chat_request(_req([{"role": "system", "content": "s"},
                                   {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]))
    assert req.question is None


def test_legacy_function_role_counts_as_tool_result():
    req = parse_chat_request(_req([{"role": "user", "content": "q"},
                                   {"role": "function", "name": "f", "content": "result"}],
                                  functions=[{"name": "f"}]))
    assert req.has_tools and req.has_tool_results and req.context == ("result",)


def _resp(choices) -> bytes:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
                       "choices": choices, "usage": {"total_tokens": 3}}).encode()


def test_response_answers_in_index_order():
    body = _resp([
        {"index": 1, "message": {"role": "assistant", "content": "second"}, "finish_reason": "stop"},
        {"index": 0, "message": {"role": "assistant", "content": "first"}, "finish_reason": "length"},
        {"index": 2, "message": {"role": "assistant", "content": None, "tool_calls": []}, "finish_reason": "tool_calls"},
    ])
    resp = parse_chat_response(body)
    assert resp.id == "chatcmpl-1" and resp.model == "gpt-x"
    assert resp.answers == ("first", "second", None)
    assert resp.finish_reasons == ("length", "stop", "tool_calls")


@pytest.mark.parametrize("body", [b"<html>", b"[]", b'{"error":{"message":"rate limited"}}',
                                  b'{"choices":[{"index":0}]}', b'{"choices":[{"index":"a","message":{}}]}'])
def test_bad_responses_raise(body):
    with pytest.raises(ProtocolError):
        parse_chat_response(body)


def test_append_keeps_every_other_field_and_skips_tool_call_choices():
    original = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
        "system_fingerprint": "fp", "usage": {"prompt_tokens": 1, "completion_tokens": 2},
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Answer é", "refusal": None},
             "logprobs": None, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": None,
                                     "tool_calls": [{"id": "c", "type": "function",
                                                     "function": {"name": "f", "arguments": "{}"}}]},
             "finish_reason": "tool_calls"},
            {"index": 2, "message": {"role": "assistant", "content": [{"type": "text", "text": "parts"}]},
             "finish_reason": "stop"},
        ],
    }
    out = json.loads(append_to_choices(json.dumps(original).encode(), "\n\n[warning]"))
    expected = json.loads(json.dumps(original))
    expected["choices"][0]["message"]["content"] = "Answer é\n\n[warning]"
    expected["choices"][2]["message"]["content"].append({"type": "text", "text": "\n\n[warning]"})
    assert out == expected


def test_append_per_choice_mapping():
    body = _resp([{"index": 0, "message": {"content": "a"}}, {"index": 1, "message": {"content": "b"}}])
    out = parse_chat_response(append_to_choices(body, {1: " !"}))
    assert out.answers == ("a", "b !")


def test_content_text_and_error_body():
    assert content_text(None) == ("", 0)
    assert content_text([{"type": "refusal", "refusal": "no"}]) == ("no", 0)
    err = json.loads(error_body("blocked", type="truthlens_blocked", code="hallucination", extra={"score": 0.9}))
    assert err == {"error": {"message": "blocked", "type": "truthlens_blocked", "param": None,
                             "code": "hallucination"}, "truthlens": {"score": 0.9}}


def test_bodies_with_a_bom_or_another_utf_still_parse():
    """JSON is read as UTF-8 directly; the rarer encodings json.loads detects keep working."""
    obj = {"messages": [{"role": "user", "content": "Qui a écrit Hamlet ?"}]}
    text = json.dumps(obj, ensure_ascii=False)
    for body in (text.encode("utf-8"), codecs.BOM_UTF8 + text.encode("utf-8"), text.encode("utf-16")):
        assert parse_chat_request(body).question == "Qui a écrit Hamlet ?"


def test_what_the_fast_reader_rejects_the_stdlib_still_reads():
    """Non-standard JSON json.loads accepts (NaN, lone surrogates) parses as before; a lone surrogate
    becomes U+FFFD in the extracted text (#19: it crashed the tokenizer)."""
    body = b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "Who? \\ud800"}]}'
    assert parse_chat_request(body).question == "Who? \ufffd"
    answer = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}}], "x": Infinity}'
    assert parse_chat_response(answer).answers == ("Paris",)
    with pytest.raises(ProtocolError, match="not valid JSON"):
        parse_chat_request(b'{"messages": [}')


def test_re_serialized_bodies_keep_integers_beyond_64_bits_exactly():
    """A body we rewrite goes out with the caller's exact numbers (a fast reader turns them into floats)."""
    big = 123456789012345678901234567890
    body = _req([{"role": "user", "content": "Who?"}], seed=big, truthlens_context=["doc"])
    out = json.loads(parse_chat_request(body).upstream_body)
    assert out["seed"] == big and isinstance(out["seed"], int)
    answer = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
                         "usage": {"n": big}}).encode()
    assert json.loads(append_to_choices(answer, " [warn]"))["usage"]["n"] == big
    assert parse_chat_request(_req([{"role": "user", "content": "Who?"}], seed=big)).upstream_body is None
