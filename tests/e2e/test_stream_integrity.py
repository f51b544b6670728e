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
from tests.e2e.harness import EnvoyProcess, SidecarProcess

pytestmark = pytest.mark.e2e

ANSWER = " ".join(f"Sentence number {i} says the tower is {300 + i} metres tall." for i in range(30))


def test_killing_the_sidecar_mid_stream_loses_no_byte(tiny_models, tmp_path: Path) -> None:
    cfg = tmp_path / "tl.yaml"
    cfg.write_text(yaml.safe_dump({"truthlens": {
        "models": {"sentinel": None, "detector": str(tiny_models["bert-token"]), "explainer": None, "surrogate": None},
        "stream": {"hold_back": "sentence"}}}))
    body = b"".join(completion_sse_chunks(ANSWER, "m", words_per_chunk=2))
    pieces = [body[i:i + 53] for i in range(0, len(body), 53)]  # events split across chunks: replies wait
    upstream = start_demo_upstream(scripts={"slow": Script(content_type="text/event-stream", chunks=pieces,
                                                          delay_s=0.01)})
    sidecar = SidecarProcess(str(cfg))
    envoy = None
    try:
        sidecar.wait_ready(timeout=120)
        envoy = EnvoyProcess(sidecar.address, upstream.url).start()
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
        sidecar.proc.send_signal(signal.SIGKILL)  # mid-stream, with chunk replies held for open sentences
        t.join(60)
        assert not t.is_alive() and status == [200]
        # fail-open: Envoy re-injects every chunk it still held for the sidecar; nothing is lost or mangled
        assert bytes(received) == body
    finally:
        if envoy is not None:
            envoy.stop()
        sidecar.stop()
        upstream.stop()
