"""The real commands: `truthlens serve` (with the bundled models when present) and `truthlens dev`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from extproc.devtools.demo_upstream import start_demo_upstream
from tests.e2e.harness import REPO, EnvoyProcess, SidecarProcess, free_port, process_stack

pytestmark = pytest.mark.e2e

MODELS = REPO / "models"
HAVE_MODELS = (MODELS / "detector" / "truthlens.json").exists()  # bundled detector (sentinel, explainer if present)
CONTEXT = "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall."


def write_cfg(path: Path, models: dict[str, str | None] | None = None) -> str:
    m = models or {"sentinel": None, "detector": None, "explainer": None}
    path.write_text(yaml.safe_dump({"truthlens": {"models": m, "inference_timeout_ms": 20000}}))
    return str(path)


# The real OnnxEngine behind the real `truthlens serve`: the tiny random test models always (no
# sentinel, so every prompt is checked), the bundled models too once they exist.
ENGINES = ["tiny"] + (["bundled"] if HAVE_MODELS else [])


@pytest.fixture(scope="module", params=ENGINES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "tiny":
        tiny = request.getfixturevalue("tiny_models")
        models = {"sentinel": None, "detector": str(tiny["bert-token"]), "explainer": str(tiny["bert-nli"]),
                  "surrogate": None}
    else:  # with the surrogate LM that make setup-dev builds: the default score stacks its context PMI
        models = {role: str(MODELS / role) if (MODELS / role / "truthlens.json").exists() else None
                  for role in ("sentinel", "detector", "explainer", "surrogate")}
    cfg = write_cfg(tmp_path_factory.mktemp("cfg") / "tl.yaml", models)
    with process_stack(cfg, start_demo_upstream(chunk_delay_s=0.002), ready_timeout=180,
                       message_timeout_s=30) as (_, envoy):
        yield request.param, envoy


def ask(envoy: EnvoyProcess, stream: bool = False) -> httpx.Response:
    body = {"model": "m", "stream": stream, "truthlens_context": [CONTEXT],
            "messages": [{"role": "user", "content": "When was the Eiffel Tower built and how tall is it?"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c", "content": CONTEXT}]}
    return httpx.post(envoy.base_url + "/v1/chat/completions", json=body, timeout=60)


def test_serve_judges_json_with_real_engine(served) -> None:
    kind, envoy = served
    r = ask(envoy)
    assert r.status_code == 200
    answer = r.json()["choices"][0]["message"]["content"]
    status = r.headers["x-truthlens-status"]
    # model-independent facts only: the bundled sentinel may call the prompt non-factual,
    # otherwise a finished check with a well-formed verdict
    assert status == "checked" or (kind == "bundled" and status == "skipped")
    if status == "checked":
        assert 0.0 <= float(r.headers["x-truthlens-score"]) <= 1.0
        assert r.headers["x-truthlens-detected"] in ("true", "false")
        spans = json.loads(r.headers["x-truthlens-spans"])
        assert len(spans) <= int(r.headers["x-truthlens-span-count"])
        for start, end, span_score, _label in spans:
            assert 0 <= start < end <= len(answer)
            assert 0.0 <= span_score <= 1.0
        assert r.headers["x-truthlens-iterations"] == "1"
        expected = "detector,verifier,context_pmi" if kind == "bundled" else "detector,verifier"
        assert r.headers["x-truthlens-signals"] == expected
    assert float(r.headers["x-truthlens-latency-ms"]) > 0


def test_serve_judges_sse_with_real_engine(served) -> None:
    kind, envoy = served
    r = ask(envoy, stream=True)
    events = [e[len("data: "):] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    if r.headers["x-truthlens-status"] == "streaming":
        verdict = json.loads(events[-2])["truthlens"]
        assert verdict["status"] == "checked" and 0.0 <= verdict["score"] <= 1.0
        # streams are scored sentence by sentence by detector + verifier: the surrogate needs the whole answer
        assert verdict["signals"] == ["detector", "verifier"]
        answer = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-2])
        for span in verdict["spans"]:
            assert answer[span["start"]:span["end"]] == span["text"]
    else:
        assert kind == "bundled" and r.headers["x-truthlens-status"] == "skipped"


def test_sigterm_shuts_serve_down_cleanly(tmp_path: Path) -> None:
    sidecar = SidecarProcess(write_cfg(tmp_path / "tl.yaml"))
    sidecar.wait_ready(timeout=60)
    sidecar.proc.send_signal(signal.SIGTERM)
    assert sidecar.proc.wait(30) == 0


def test_serve_rejects_bad_config_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  max_message_bytes: -5\n")
    r = subprocess.run([sys.executable, "-m", "extproc.commands.serve", "--config", str(bad)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "server.max_message_bytes" in r.stderr


def test_dev_starts_all_three_and_stops_on_sigterm(tmp_path: Path) -> None:
    """What `make run` runs: demo upstream, sidecar, Envoy; usage printed; SIGTERM stops everything."""
    listen, admin, grpc_port, metrics, demo = (free_port() for _ in range(5))
    cmd = [sys.executable, "-m", "extproc.commands.dev", "--config", write_cfg(tmp_path / "tl.yaml"),
           "--listen-port", str(listen), "--admin-port", str(admin), "--grpc-address", f"127.0.0.1:{grpc_port}",
           "--metrics-address", f"127.0.0.1:{metrics}", "--demo-port", str(demo)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "truthlens dev exited early:\n" + "".join(lines)
            lines.append(line)
            if "TruthLens is up" in line:
                break
        out = "".join(lines)
        assert out.index("[1/3] demo upstream") < out.index("[2/3] sidecar") < out.index("[3/3] envoy")
        r = httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": "Hi?"}]})
        assert r.status_code == 200 and r.headers["x-truthlens-enabled"] == "true"
        assert "truthlens_" in httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{admin}/ready", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
