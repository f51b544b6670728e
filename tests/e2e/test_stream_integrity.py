"""Fail-open never costs stream bytes: the sidecar killed mid-stream, with replies held for sentences."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from extproc.devtools.demo_upstream import Script, completion_sse_chunks, start_demo_upstream
from tests.e2e.harness import process_stack

pytestmark = pytest.mark.e2e

ANSWER = " ".join(f"Sentence number {i} says the tower is {300 + i} metres tall." for i in range(30))


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_sidecar_lost_mid_stream_loses_no_byte(fault: str, tiny_models, tmp_path: Path) -> None:
    """kill: SIGKILL. freeze: SIGSTOP until the upstream has finished and Envoy's message_timeout (1 s here)
    has passed, then SIGCONT."""
    cfg = tmp_path / "tl.yaml"
    cfg.write_text(yaml.safe_dump({"truthlens": {
        "models": {"sentinel": None, "detector": str(tiny_models["bert-token"]), "explainer": None, "surrogate": None},
        "stream": {"hold_back": "sentence"}}}))
    body = b"".join(completion_sse_chunks(ANSWER, "m", words_per_chunk=2))
    pieces = [body[i:i + 53] for i in range(0, len(body), 53)]  # events split across chunks: replies wait
    upstream = start_demo_upstream(scripts={"slow": Script(content_type="text/event-stream", chunks=pieces,
                                                          delay_s=0.01)})
    with process_stack(cfg, upstream, message_timeout_s=1.0) as (sidecar, envoy):
        received = bytearray()
        status: list[int] = []
        started = threading.Event()

        def client() -> None:
            req = {"model": "m", "stream": True, "truthlens_context": ["The tower is tall."],
                   "messages": [{"role": "user", "content": "How tall is the tower?"}]}
            with httpx.stream("POST", envoy.base_url + "/v1/chat/completions", json=req, timeout=60,
                              headers={"x-demo-script": "slow"}) as r:
                status.append(r.status_code)
                for part in r.iter_raw():
                    received.extend(part)
                    if len(received) > len(body) // 4:
                        started.set()

        t = threading.Thread(target=client)
        t.start()
        assert started.wait(30), "the stream never got going"
        if fault == "kill":  # mid-stream, with chunk replies held for open sentences
            sidecar.proc.send_signal(signal.SIGKILL)
        else:
            sidecar.proc.send_signal(signal.SIGSTOP)
            time.sleep(8.0)  # past the end of the upstream stream + message_timeout: Envoy fails open
            sidecar.proc.send_signal(signal.SIGCONT)
        t.join(60)
        assert not t.is_alive() and status == [200]
        # fail-open: Envoy re-injects every chunk it still held for the sidecar; nothing is lost or mangled.
        # A frozen sidecar may also catch up (Envoy's timer restarts with every chunk it sends while the
        # upstream keeps streaming) and then closes the stream with its verdict event before [DONE].
        got = bytes(received)
        done = body.index(b"data: [DONE]")
        if fault == "freeze" and got != body:
            verdict = got[done:len(got) - (len(body) - done)]
            assert got[:done] == body[:done] and got.endswith(body[done:])
            assert verdict.startswith(b"data: {") and b'"truthlens"' in verdict and verdict.endswith(b"\n\n")
        else:
            assert got == body
