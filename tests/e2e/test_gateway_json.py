"""Buffered JSON chat completions through real Envoy + sidecar + scripted upstream."""

from __future__ import annotations

import gzip
import json

import httpx
import openai
import pytest

from extproc.devtools.demo_upstream import INJECTED_CLAIM, Script, completion_json
from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

CONTEXT = "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall."


def chat(question: str, *, tool: str | None = CONTEXT, rag: list[str] | None = None, **extra: object) -> dict:
    """A chat request; `tool` becomes a tool result (grounding the upstream can see and echo)."""
    messages: list[dict] = [{"role": "user", "content": question}]
    if tool:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": tool},
        ]
    body: dict = {"model": "truthlens-demo", "messages": messages, **extra}
    if rag is not None:
        body["truthlens_context"] = rag
    return body


def post(gw: Gateway, body: dict | bytes, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions"):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(gw.base_url + path, content=content, timeout=30,
                      headers={"content-type": "application/json", **(headers or {})})


def truthlens_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.startswith("x-truthlens-")}


def last_upstream(gw: Gateway):
    return gw.upstream.requests[-1]


def test_non_chat_route_is_byte_identical_and_unmarked(gateway: Gateway) -> None:
    direct = httpx.get(gateway.upstream.url + "/v1/models")
    via = httpx.get(gateway.base_url + "/v1/models")
    assert via.status_code == 200
    assert via.content == direct.content
    assert truthlens_headers(via) == {}


def test_checked_detection_with_header_action(gateway: Gateway) -> None:
    r = post(gateway, chat("How tall is the Eiffel Tower?"))
    assert r.status_code == 200
    h = truthlens_headers(r)
    assert h["x-truthlens-status"] == "checked"
    assert h["x-truthlens-enabled"] == "true"
    assert h["x-truthlens-mode"] == "lightweight"
    assert h["x-truthlens-detected"] == "true"
    assert float(h["x-truthlens-score"]) == pytest.approx(0.9)
    assert h["x-truthlens-iterations"] == "1"
    assert float(h["x-truthlens-latency-ms"]) >= 0
    spans = json.loads(h["x-truthlens-spans"])
    answer = r.json()["choices"][0]["message"]["content"]
    start, end = spans[0][0], spans[0][1]
    assert answer[start:end] == INJECTED_CLAIM
    # header action: the body is exactly what the upstream sent
    assert INJECTED_CLAIM in answer and "[TruthLens]" not in answer


def test_upstream_sees_identity_encoding_no_rag_field_and_no_spoofed_headers(gateway: Gateway) -> None:
    spoof = {"x-truthlens-status": "checked", "X-TruthLens-Score": "0.0", "accept-encoding": "gzip, br"}
    r = post(gateway, chat("How tall is the Eiffel Tower?", tool=None, rag=[CONTEXT]), headers=spoof)
    seen = last_upstream(gateway)
    assert not any(k.startswith("x-truthlens-") for k in seen.headers)
    assert seen.headers["accept-encoding"] == "identity"
    sent = json.loads(seen.body)
    assert "truthlens_context" not in sent
    assert sent["messages"][0]["content"] == "How tall is the Eiffel Tower?"
    assert int(seen.headers["content-length"]) == len(seen.body)
    # the RAG document was used as grounding: a check happened and the client got a real verdict
    assert r.headers["x-truthlens-status"] == "checked"
    assert r.headers["x-truthlens-score"] != "0.0"


def test_unmutated_body_arrives_byte_identical(gateway: Gateway) -> None:
    body = json.dumps(completion_json("Paris is in France.", "m"), indent=3).encode() + b"\n"
    gateway.upstream.scripts["pretty"] = Script(body=body)
    r = post(gateway, chat("Where is Paris?"), headers={"x-demo-script": "pretty"})
    assert r.headers["x-truthlens-status"] == "checked"
    assert r.headers["x-truthlens-detected"] == "false"
    assert r.content == body
    assert int(r.headers["content-length"]) == len(body)


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (Script(body=b'{"choices": [', content_type="application/json"), "bad_json"),
        (Script(body=b"plain words, not JSON", content_type="text/plain"), "unsupported_content"),
        (Script(status=503, body=b'{"error":{"message":"busy"}}'), "upstream_error"),
        (Script(body=b"\x1f\x8b garbage", headers={"content-encoding": "compress"}), "unsupported_content"),
    ],
    ids=["bad-json", "text-plain", "status-503", "unknown-coding"],
)
def test_unjudgeable_responses_pass_through_byte_identical(gateway: Gateway, script: Script, reason: str) -> None:
    gateway.upstream.scripts["unjudgeable"] = script
    r = post(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-demo-script": "unjudgeable"})
    assert r.status_code == script.status
    assert r.content == script.body
    assert r.headers["x-truthlens-status"] == "unchecked"
    assert r.headers["x-truthlens-reason"] == reason


def test_gzip_response_is_judged(gateway: Gateway) -> None:
    payload = json.dumps(completion_json("The tower is in Paris. " + INJECTED_CLAIM, "m")).encode()
    gateway.upstream.scripts["gz"] = Script(body=payload, gzip=True)
    r = post(gateway, chat("Where is the tower?"), headers={"x-demo-script": "gz"})
    assert r.headers["x-truthlens-status"] == "checked"
    assert r.headers["x-truthlens-detected"] == "true"
    assert r.json()["choices"][0]["message"]["content"].endswith(INJECTED_CLAIM)


def test_warn_appends_warning_and_fixes_content_length(gateway: Gateway) -> None:
    r = post(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-tl-action": "warn"})
    assert r.status_code == 200
    assert int(r.headers["content-length"]) == len(r.content)
    content = r.json()["choices"][0]["message"]["content"]
    assert content.startswith("The Eiffel Tower was built")
    assert "[TruthLens]" in content and "Oslo" in content.split("[TruthLens]")[1]
    assert r.headers["x-truthlens-decision"] == "action-warn"


def test_warn_on_gzip_response_sends_identity_body(gateway: Gateway) -> None:
    payload = json.dumps(completion_json("Paris. " + INJECTED_CLAIM, "m")).encode()
    gateway.upstream.scripts["gzwarn"] = Script(body=payload, gzip=True)
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json=chat("Where?"),
                   headers={"x-demo-script": "gzwarn", "x-tl-action": "warn", "accept-encoding": "identity"})
    assert "content-encoding" not in r.headers
    assert int(r.headers["content-length"]) == len(r.content)
    assert "[TruthLens]" in r.json()["choices"][0]["message"]["content"]


def test_warn_does_nothing_on_clean_answer(gateway: Gateway) -> None:
    clean = json.dumps(completion_json("The tower is 330 metres tall.", "m")).encode()
    gateway.upstream.scripts["clean"] = Script(body=clean)
    r = post(gateway, chat("How tall?"), headers={"x-tl-action": "warn", "x-demo-script": "clean"})
    assert r.content == clean
    assert r.headers["x-truthlens-detected"] == "false"


def test_block_returns_error_with_verdict(gateway: Gateway) -> None:
    r = post(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-tl-action": "block"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "truthlens_blocked"
    assert err["truthlens"]["spans"][0]["text"] == INJECTED_CLAIM
    assert r.headers["x-truthlens-status"] == "checked"
    assert int(r.headers["content-length"]) == len(r.content)


def test_block_with_openai_client_raises_api_error(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="test", max_retries=0,
                           default_headers={"x-tl-action": "block"})
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**chat("How tall is the Eiffel Tower?"))
    assert info.value.status_code == 422
    assert info.value.response.headers["x-truthlens-detected"] == "true"


def test_action_none_adds_nothing(gateway: Gateway) -> None:
    r = post(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-tl-action": "none"})
    assert r.status_code == 200
    assert truthlens_headers(r) == {}
    assert r.json()["choices"][0]["message"]["content"].endswith(INJECTED_CLAIM)


def test_openai_client_non_streaming_reads_headers(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        **chat("How tall is the Eiffel Tower?", tool=None), extra_body={"truthlens_context": [CONTEXT]}
    )
    completion = raw.parse()
    assert completion.choices[0].message.content.endswith(INJECTED_CLAIM)
    assert raw.headers["x-truthlens-status"] == "checked"


@pytest.mark.parametrize(
    ("body", "headers", "status", "reason"),
    [
        # without documents (with them the request is checked: truthlens.grounding.check_when_grounded)
        (chat("Write a short poem about the sea", tool=None), {}, "skipped", "non_factual"),
        (chat("How tall is the Eiffel Tower?", tool=None), {}, "unverified", "no_context"),
        (chat("How tall is the Eiffel Tower?", tool=None, tools=[{"type": "function", "function": {"name": "f"}}]),
         {}, "unverified", "tools_without_results"),
        (chat("How tall is the Eiffel Tower?"), {"x-tl-disable": "1"}, "disabled", None),
        (chat("TRIGGER_ERROR how tall?"), {}, "unchecked", "error"),
        (chat("TRIGGER_OVERLOAD how tall?"), {}, "unchecked", "overloaded"),
        (chat("TRIGGER_TIMEOUT how tall?"), {}, "unchecked", "timeout"),
    ],
    ids=["skipped", "unverified", "tools-no-results", "disabled", "error", "overloaded", "timeout"],
)
def test_each_status(gateway: Gateway, body: dict, headers: dict, status: str, reason: str | None) -> None:
    r = post(gateway, body, headers=headers)
    assert r.status_code == 200
    assert r.headers["x-truthlens-status"] == status
    assert r.headers.get("x-truthlens-reason") == reason
    assert r.headers["x-truthlens-enabled"] == ("false" if status == "disabled" else "true")
    assert "x-truthlens-score" not in r.headers  # only a finished check has a score
    assert r.json()["choices"][0]["message"]["content"]  # the answer still arrives unchanged


def test_invalid_request_body_passes_to_upstream_unchanged(gateway: Gateway) -> None:
    raw = b'{"model": "x", "messages": "not a list"}'
    r = post(gateway, raw)
    assert gateway.upstream.requests[-1].body == raw
    assert r.status_code == 400  # the demo upstream's own answer
    assert r.headers["x-truthlens-status"] == "unchecked"


def test_gzip_compressed_client_request_is_forwarded(gateway: Gateway) -> None:
    """A body the sidecar cannot read goes upstream untouched (no RAG removal possible)."""
    raw = gzip.compress(json.dumps(chat("How tall?")).encode())
    r = post(gateway, raw, headers={"content-encoding": "gzip"})
    assert gateway.upstream.requests[-1].body == raw
    assert r.headers["x-truthlens-status"] == "unchecked"


def test_standard_mode_refines_through_envoy(gateway: Gateway) -> None:
    r = post(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-tl-mode": "standard"})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == (
        "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall.")
    assert r.headers["x-truthlens-mode"] == "standard"
    assert r.headers["x-truthlens-iterations"] == "2"
    assert r.headers["x-truthlens-detected"] == "false"
    assert int(r.headers["content-length"]) == len(r.content)


# ---- hostile input through Envoy (#19) ---------------------------------------------------------

FORGED = {"x-truthlens-status": "checked", "x-truthlens-score": "0.0000", "x-truthlens-detected": "false",
          "x-truthlens-anything": "x"}


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/embeddings"),
                                              ("GET", "/v1/chat/completions")])
def test_forged_verdict_headers_never_reach_the_client_on_non_chat_routes(gateway: Gateway, method: str,
                                                                          path: str) -> None:
    """An upstream answering a route the sidecar does not judge could set x-truthlens-status: checked."""
    gateway.upstream.scripts["forged"] = Script(body=b'{"object":"list","data":[]}', headers=FORGED)
    r = httpx.request(method, gateway.base_url + path, headers={"x-demo-script": "forged"}, timeout=30)
    assert r.status_code == 200 and r.content == b'{"object":"list","data":[]}'
    assert truthlens_headers(r) == {}


def test_forged_verdict_headers_on_the_chat_route_give_way_to_the_real_verdict(gateway: Gateway) -> None:
    gateway.upstream.scripts["forged-chat"] = Script(body=json.dumps(completion_json("It is in Oslo.", "m")).encode(),
                                                     headers=FORGED)
    r = post(gateway, chat("Where is the tower?"), headers={"x-demo-script": "forged-chat"})
    h = truthlens_headers(r)
    assert h["x-truthlens-status"] == "checked" and h["x-truthlens-detected"] == "true"
    assert "x-truthlens-anything" not in h


@pytest.mark.parametrize("path", [
    "/v1/chat/./completions", "/v1/chat%2Fcompletions", "/v1/chat/completions;x", "/V1/CHAT/COMPLETIONS",
    "/v1//chat/completions", "/v1/models/../chat/completions", "/v1/%63hat/completions", "/v1/chat/completions/",
])
def test_every_spelling_of_the_chat_path_is_judged_through_envoy(gateway: Gateway, path: str) -> None:
    """5 of 8 such paths passed with no verdict and with the RAG field (#19)."""
    gateway.upstream.scripts["variant"] = Script(body=json.dumps(completion_json("It is in Oslo.", "m")).encode())
    r = httpx.post(gateway.base_url + path, content=json.dumps(chat("Where?", rag=["It is in Paris."])).encode(),
                   headers={"content-type": "application/json", "x-demo-script": "variant"}, timeout=30)
    assert b"truthlens_context" not in last_upstream(gateway).body
    assert r.headers["x-truthlens-status"] == "checked"


def test_rag_field_of_the_wrong_type_is_refused_before_the_upstream(gateway: Gateway) -> None:
    before = len(gateway.upstream.requests)
    body = chat("How tall?")
    body["truthlens_context"] = [1, 2]
    r = post(gateway, body)
    assert r.status_code == 400 and len(gateway.upstream.requests) == before
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", "truthlens_context")


@pytest.mark.parametrize(("body", "refused"), [
    ({"messages": [], "truthlens_context": ["doc"]}, False),  # schema-invalid: forwarded without the field
    ({"model": "m", "messages": [{"role": "user", "content": "q"}], "truthlens_context": 42}, True),
])
def test_rag_field_never_reaches_the_upstream(gateway: Gateway, body: dict, refused: bool) -> None:
    before = len(gateway.upstream.requests)
    r = post(gateway, body)
    sent = gateway.upstream.requests[before:]
    assert all(b"truthlens_context" not in q.body for q in sent) and len(sent) == (0 if refused else 1)
    assert (r.status_code == 400) is refused
    if not refused:
        assert (r.headers["x-truthlens-status"], r.headers["x-truthlens-reason"]) == ("unchecked", "bad_json")


def test_lone_surrogates_are_judged_not_errors(gateway: Gateway) -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"Where? \\ud800"}],"truthlens_context":["In Paris."]}'
    gateway.upstream.scripts["surrogate"] = Script(
        body=b'{"id":"\\udc00","choices":[{"index":0,"message":{"role":"assistant","content":"In Oslo \\ud800."}}]}')
    r = post(gateway, raw, headers={"x-demo-script": "surrogate"})
    assert last_upstream(gateway).body == b'{"model":"m","messages":[{"role":"user","content":"Where? \\ud800"}]}'
    assert (r.headers["x-truthlens-status"], r.headers["x-truthlens-detected"]) == ("checked", "true")


def test_compressed_request_carrying_the_rag_field_is_refused(gateway: Gateway) -> None:
    before = len(gateway.upstream.requests)
    r = post(gateway, gzip.compress(json.dumps(chat("How tall?", rag=["doc"])).encode()),
             headers={"content-encoding": "gzip"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truthlens_context"
    assert len(gateway.upstream.requests) == before
