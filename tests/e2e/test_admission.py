"""Admission through real Envoy (#19 item 2): a 4 MB context or answer is answered unchecked/too_large at once,
body untouched, and a request arriving beside it is still checked."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import yaml

from extproc.devtools.demo_upstream import Script, completion_json, completion_sse_chunks, start_demo_upstream
from tests.e2e.harness import process_stack

pytestmark = pytest.mark.e2e

SHORT = "The tower is 330 metres tall. It opened in 1889."
BIG_ANSWER = "The tower is 330 metres tall. " * (4 * 1024 * 1024 // 30 - 100)  # a ~4 MB body
BIG_CONTEXT = ["The tower is 330 metres tall and opened in 1889. " * (4 * 1024 * 1024 // 50)]


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("admission") / "tl.yaml"
    # a detector held up by the 4 MB request answers the normal one unchecked/timeout after 3 s: "checked"
    # says it was not (how fast it is, is bench.faults' job: 13-113 ms there)
    cfg.write_text(yaml.safe_dump({"truthlens": {"inference_timeout_ms": 3000, "models": {
        "sentinel": None, "detector": str(tiny_models["bert-token"]), "explainer": str(tiny_models["bert-nli"]),
        "surrogate": None}}}))
    scripts = {
        "short": Script(body=json.dumps(completion_json(SHORT, "m")).encode()),
        "big": Script(body=json.dumps(completion_json(BIG_ANSWER, "m")).encode()),
        "big-sse": Script(content_type="text/event-stream", delay_s=0.0,
                          chunks=completion_sse_chunks(BIG_ANSWER, "m", words_per_chunk=4000)),
    }
    with process_stack(cfg, start_demo_upstream(scripts=scripts)) as (_, envoy):
        yield envoy, scripts


def _post(envoy, script: str, context: list[str], stream: bool = False) -> tuple[httpx.Response, float]:
    req = {"model": "m", "stream": stream, "truthlens_context": context,
           "messages": [{"role": "user", "content": "How tall is the tower?"}]}
    t0 = time.perf_counter()
    r = httpx.post(envoy.base_url + "/v1/chat/completions", json=req, headers={"x-demo-script": script}, timeout=60)
    return r, time.perf_counter() - t0


@pytest.mark.parametrize("script, context, stream", [
    ("short", BIG_CONTEXT, False),  # a 4 MB context
    ("big", ["The tower is 330 metres tall."], False),  # a 4 MB answer
    ("big-sse", ["The tower is 330 metres tall."], True),  # a 4 MB streamed answer
], ids=["context", "answer", "sse-answer"])
def test_a_4mb_request_is_too_large_at_once_and_others_are_still_checked(stack, script, context, stream) -> None:
    envoy, scripts = stack
    big: list[tuple[httpx.Response, float]] = []
    t = threading.Thread(target=lambda: big.append(_post(envoy, script, context, stream)))
    t.start()
    time.sleep(0.1)
    normal, _ = _post(envoy, "short", ["The tower is 330 metres tall. It opened in 1889."])
    t.join(60)
    assert normal.status_code == 200 and normal.headers["x-truthlens-status"] == "checked"
    ((resp, _),) = big
    sent = scripts[script].body or b"".join(scripts[script].chunks)
    if stream:
        assert resp.headers["x-truthlens-status"] == "streaming"
        verdict = [line for line in resp.content.split(b"\n\n") if b'"truthlens"' in line]
        assert len(verdict) == 1 and json.loads(verdict[0][6:])["truthlens"]["reason"] == "too_large"
        assert resp.content.replace(verdict[0] + b"\n\n", b"") == sent  # every byte the upstream sent, unchanged
    else:
        assert (resp.headers["x-truthlens-status"], resp.headers["x-truthlens-reason"]) == ("unchecked", "too_large")
        assert resp.content == sent
    # too large is said at once, not after a timeout: the reason would be "timeout" otherwise
