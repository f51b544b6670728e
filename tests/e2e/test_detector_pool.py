"""A remote detector pool, end to end: openai client -> real Envoy -> `truthlens serve` (configured with
truthlens.inference.remote, no local model) -> `truthlens serve --detector-api` in another process -> verdict.
Killing the pool mid-run leaves requests `unchecked`, never failed; a restarted pool is found again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
import yaml

from extproc.devtools.demo_upstream import INJECTED_CLAIM, start_demo_upstream
from tests.e2e.harness import REPO, EnvoyProcess, free_port, process_stack, terminate, wait_grpc_serving

pytestmark = pytest.mark.e2e

CONTEXT = "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall."
QUESTION = "When was the Eiffel Tower built and how tall is it?"


class DetectorPoolProcess:
    """`truthlens serve --detector-api` with the tiny test models (detector + explainer, no sentinel)."""

    def __init__(self, config: Path, port: int) -> None:
        self.address = f"127.0.0.1:{port}"
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DetectorPoolProcess:
        cmd = [sys.executable, "-m", "extproc.commands.serve", "--detector-api", "--config", str(self.config),
               "--grpc-address", "127.0.0.1:0", "--port", self.address.rpartition(":")[2], "--no-metrics"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if not wait_grpc_serving(self.address, 120, self.proc):
            out = self.proc.stdout.read().decode() if self.proc.poll() is not None and self.proc.stdout else ""
            raise RuntimeError(f"detector API did not become SERVING: {out[-2000:]}")
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc)


@pytest.fixture(scope="module")
def pool_gateway(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DetectorPoolProcess, EnvoyProcess]]:  # noqa: ANN001
    d = tmp_path_factory.mktemp("pool")
    pool_cfg = d / "pool.yaml"
    pool_cfg.write_text(yaml.safe_dump({"truthlens": {"models": {
        "sentinel": None, "detector": str(tiny_models["bert-token"]), "explainer": str(tiny_models["bert-nli"]),
        "surrogate": None}}}))
    pool = DetectorPoolProcess(pool_cfg, free_port()).start()
    # the sidecar's own model directories do not exist: with a remote pool it must not load (or need) any
    missing = str(d / "no-such-model")
    sidecar_cfg = d / "sidecar.yaml"
    sidecar_cfg.write_text(yaml.safe_dump({"truthlens": {
        "inference_timeout_ms": 20000,
        "models": {"sentinel": missing, "detector": missing, "explainer": missing, "surrogate": missing},
        "inference": {"remote": [pool.address], "deadline_ms": 15000, "retries": 1}}}))
    with process_stack(sidecar_cfg, start_demo_upstream(chunk_delay_s=0.002), ready_timeout=60, also_stop=[pool],
                       message_timeout_s=30) as (_, envoy):
        yield pool, envoy


def ask(client: openai.OpenAI) -> tuple[int, dict[str, str], str]:
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": QUESTION}], extra_body={"truthlens_context": [CONTEXT]})
    return raw.http_response.status_code, dict(raw.headers), raw.parse().choices[0].message.content or ""


def test_verdict_comes_from_the_remote_pool_and_survives_its_death(pool_gateway) -> None:  # noqa: ANN001
    pool, envoy = pool_gateway
    client = openai.OpenAI(base_url=envoy.base_url + "/v1", api_key="test", max_retries=0, timeout=60)

    status, headers, answer = ask(client)
    assert status == 200 and INJECTED_CLAIM in answer
    assert headers["x-truthlens-status"] == "checked", headers
    assert headers["x-truthlens-signals"] == "detector,verifier"  # the pool's detector + NLI verifier
    assert 0.0 <= float(headers["x-truthlens-score"]) <= 1.0
    for start, end, _score, _label in json.loads(headers["x-truthlens-spans"]):
        assert 0 <= start < end <= len(answer)

    # SSE through the pool too: the verdict arrives as the last event
    r = httpx.post(envoy.base_url + "/v1/chat/completions", timeout=60,
                   json={"model": "m", "stream": True, "truthlens_context": [CONTEXT],
                         "messages": [{"role": "user", "content": QUESTION}]})
    events = [e[len("data: "):] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["truthlens"]["status"] == "checked"

    # kill the pool while requests are in flight: every response is a 200, checked or unchecked
    results: list[tuple[int, str, str | None]] = []
    stop = threading.Event()

    def load() -> None:
        c = openai.OpenAI(base_url=envoy.base_url + "/v1", api_key="test", max_retries=0, timeout=60)
        while not stop.is_set():
            s, h, _ = ask(c)
            results.append((s, h.get("x-truthlens-status", ""), h.get("x-truthlens-reason")))

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not any(st == "checked" for _, st, _ in results) and time.monotonic() < deadline:
        time.sleep(0.1)
    pool.kill()
    killed_at = len(results)
    deadline = time.monotonic() + 30
    while sum(st == "unchecked" for _, st, _ in results[killed_at:]) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(60)
    assert results and all(s == 200 for s, _, _ in results), results
    assert {st for _, st, _ in results} == {"checked", "unchecked"}, results

    for _ in range(3):  # the pool is gone: unchecked, fast, never an error
        t0 = time.monotonic()
        status, headers, answer = ask(client)
        assert status == 200 and INJECTED_CLAIM in answer
        assert headers["x-truthlens-status"] == "unchecked"
        assert headers["x-truthlens-reason"] == "models_unavailable"
        assert time.monotonic() - t0 < 5.0

    # a pool back on the same address is used again (reconnect backoff is capped at 2 s)
    pool.start()
    deadline = time.monotonic() + 30
    while True:
        status, headers, _ = ask(client)
        assert status == 200
        if headers["x-truthlens-status"] == "checked" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert headers["x-truthlens-status"] == "checked"
