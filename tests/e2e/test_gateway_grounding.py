"""Documents where RAG apps put them (#17), through real Envoy + sidecar + the demo upstream: every layout is
checked, with the unsupported claim as the span; a prompt without documents still takes the sentinel's paths."""

from __future__ import annotations

import json

import httpx
import pytest

from extproc.devtools.demo_upstream import INJECTED_CLAIM
from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

TOWER = "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall."
QUESTION = "How tall is the Eiffel Tower?"

LAYOUTS = {
    "system-prompt": [
        {"role": "system", "content": f"Answer from the context only.\n\nContext:\n{TOWER}"},
        {"role": "user", "content": QUESTION}],
    "context-question": [{"role": "user", "content": f"Context: {TOWER}\nQuestion: {QUESTION}"}],
    "documents-tags": [{"role": "user", "content": f"<documents>\n<document>{TOWER}</document>\n</documents>\n{QUESTION}"}],
    "numbered-sources": [{"role": "user", "content": "[1] The Eiffel Tower was built from 1887 to 1889 in Paris.\n"
                                                     f"[2] It is 330 metres tall.\n\n{QUESTION}"}],
    "tool-results": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": TOWER}],
}


def post(gw: Gateway, messages: list[dict]) -> httpx.Response:
    body = {"model": "truthlens-demo", "messages": messages}
    return httpx.post(gw.base_url + "/v1/chat/completions", json=body, timeout=30)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_is_checked_with_the_unsupported_claim_as_span(gateway: Gateway, layout: str) -> None:
    r = post(gateway, LAYOUTS[layout])
    assert r.status_code == 200
    assert r.headers["x-truthlens-status"] == "checked", dict(r.headers)
    assert r.headers["x-truthlens-detected"] == "true"
    answer = r.json()["choices"][0]["message"]["content"]
    assert answer.startswith("The Eiffel Tower was built from 1887 to 1889 in Paris.")  # the demo read the documents
    spans = json.loads(r.headers["x-truthlens-spans"])
    assert [answer[s[0]:s[1]] for s in spans] == [INJECTED_CLAIM]
    sent = json.loads(gateway.upstream.requests[-1].body)
    assert sent["messages"] == LAYOUTS[layout]  # the documents stay in the request: only read, never moved


def test_a_grounded_non_factual_prompt_is_still_checked(gateway: Gateway) -> None:
    """check_when_grounded (default): the sentinel would call "poem" non-factual; documents came, so no skip."""
    r = post(gateway, [{"role": "user", "content": f"Context: {TOWER}\nQuestion: Write a poem about its height."}])
    assert r.headers["x-truthlens-status"] == "checked"


@pytest.mark.parametrize(
    ("prompt", "status", "reason"),
    [
        ("PREFILTER_SKIP tell me something", "skipped", "non_factual"),  # the prefilter is sure
        ("Write a poem about the sea", "skipped", "non_factual"),  # the sentinel model says non-factual
        (QUESTION, "unverified", "no_context"),  # factual, nothing to check against
    ],
    ids=["prefilter", "sentinel-model", "factual"],
)
def test_without_documents_the_sentinel_decides(gateway: Gateway, prompt: str, status: str, reason: str) -> None:
    r = post(gateway, [{"role": "system", "content": "You are a helpful assistant."},
                       {"role": "user", "content": prompt}])
    assert (r.headers["x-truthlens-status"], r.headers["x-truthlens-reason"]) == (status, reason)
