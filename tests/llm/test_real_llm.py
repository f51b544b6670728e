"""The gateway in front of a real LLM: llama-cpp-python serving SmolLM2-135M-Instruct (`make test-llm`).

What a scripted upstream cannot show: a real server's JSON and SSE framing, its own logprobs, and
answers nobody wrote in advance, all through real Envoy to the real `truthlens serve` with the
bundled models. Marked `llm`: `make test` deselects these; `make test-llm` builds llama-cpp-python
(~5 minutes) and runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Iterator

import httpx
import openai
import pytest
import yaml

from extproc.devtools.processes import EnvoyProcess, free_port, terminate, wait_http_ok
from extproc.inference.gguf_export import default_gguf
from tests.e2e.harness import REPO, SidecarProcess

pytestmark = [pytest.mark.llm, pytest.mark.e2e]

CONTEXT = "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall."
QUESTION = f"Context: {CONTEXT}\nQuestion: How tall is the Eiffel Tower?"


@pytest.fixture(scope="module")
def llm() -> Iterator[str]:
    python = os.environ.get("TRUTHLENS_LLM_PYTHON")
    assert python, "run through `make test-llm` (it builds llama-cpp-python and sets TRUTHLENS_LLM_PYTHON)"
    port = free_port()
    proc = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", str(default_gguf()), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "2048", "--model_alias", "smollm2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_http_ok(url + "/v1/models", 120, proc), "llama-cpp-python server did not start"
        yield url
    finally:
        terminate(proc)


@pytest.fixture(scope="module")
def gateway(llm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyProcess]:
    models = REPO / "models"
    cfg = tmp_path_factory.mktemp("cfg") / "tl.yaml"
    cfg.write_text(yaml.safe_dump({
        "truthlens": {"models": {r: str(models / r) for r in ("sentinel", "detector", "explainer", "surrogate")},
                      "inference_timeout_ms": 30000,
                      "signals": {"upstream_logprobs": True, "upstream_top_logprobs": 3}}}))
    sidecar = SidecarProcess(str(cfg))
    envoy = None
    try:
        sidecar.wait_ready(timeout=300)
        envoy = EnvoyProcess(sidecar.address, llm, message_timeout_s=60).start()
        yield envoy
    finally:
        if envoy is not None:
            envoy.stop()
        sidecar.stop()


def ask(stream: bool = False, **extra) -> dict:
    return {"model": "smollm2", "max_tokens": 48, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": QUESTION}], **extra}


def test_a_real_json_answer_is_checked_and_arrives_without_the_logprobs_we_asked_for(gateway: EnvoyProcess) -> None:
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json=ask(), timeout=120)
    assert r.status_code == 200
    assert r.headers["x-truthlens-status"] == "checked"  # the Context:/Question: layout counts as grounding
    assert int(r.headers["x-truthlens-upstream-tokens"]) > 0  # llama.cpp's own logprobs were read
    body = r.json()
    assert body["choices"][0]["message"]["content"]
    assert "logprobs" not in body["choices"][0] or body["choices"][0]["logprobs"] is None


def test_logprobs_the_client_asked_for_reach_it(gateway: EnvoyProcess) -> None:
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json=ask(logprobs=True, top_logprobs=2), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"]["content"]


def test_a_real_stream_ends_with_the_verdict_and_no_logprobs(gateway: EnvoyProcess) -> None:
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json=ask(stream=True), timeout=120)
    assert r.status_code == 200 and r.headers["x-truthlens-status"] == "streaming"
    events = [b[len("data: "):] for b in r.text.replace("\r\n", "\n").split("\n\n") if b.startswith("data: ")]
    assert events[-1] == "[DONE]"
    verdict = json.loads(events[-2])["truthlens"]
    assert verdict["status"] == "checked" and verdict["upstream"]["tokens"] > 0
    assert all(c.get("logprobs") is None for e in events[:-2] for c in json.loads(e)["choices"])


def test_the_openai_client_reads_the_judged_stream(gateway: EnvoyProcess) -> None:
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="none", max_retries=0)
    text, verdicts = "", []
    for chunk in client.chat.completions.create(**ask(stream=True)):
        text += "".join(c.delta.content or "" for c in chunk.choices)
        if (chunk.model_extra or {}).get("truthlens"):
            verdicts.append(chunk.model_extra["truthlens"])
    assert text and len(verdicts) == 1 and verdicts[0]["status"] == "checked"
