"""What `truthlens dev` (`make run`) prints works as printed (#17): each command is run through the shell
against real Envoy + sidecar + demo upstream; with --upstream the examples name the upstream's model."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from urllib.parse import urlsplit

import pytest

from extproc.commands import dev
from extproc.devtools.demo_upstream import DEMO_MODEL, Script
from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e


def printed_commands(text: str) -> list[str]:
    """The shell commands in the usage text (a line ending in a backslash continues on the next)."""
    commands, current = [], ""
    for line in text.splitlines():
        if not current and not line.startswith("  ") or line.lstrip().startswith(("#", "(")):
            continue
        current += line.strip()[:-1] + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            if current:
                commands.append(current)
            current = ""
    return commands


def test_every_printed_command_works_as_printed(gateway: Gateway) -> None:
    port = urlsplit(gateway.base_url).port
    assert port is not None
    commands = printed_commands(dev.usage(port, DEMO_MODEL))
    has_openai = importlib.util.find_spec("openai") is not None
    assert [c.split()[0] for c in commands] == ["curl", "curl"] + ([dev.sys.executable] if has_openai else [])
    plain = subprocess.run(commands[0], shell=True, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "x-truthlens-status: checked" in plain.lower() and "x-truthlens-detected: true" in plain.lower()
    streamed = subprocess.run(commands[1], shell=True, capture_output=True, text=True, timeout=60, check=True).stdout
    events = [e[len("data: "):] for e in streamed.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["truthlens"]["status"] == "checked"
    if has_openai:
        out = subprocess.run(commands[2], shell=True, capture_output=True, text=True, timeout=60, check=True).stdout
        status, score = out.split()
        assert status == "checked" and float(score) > 0.5


def test_without_the_openai_client_its_example_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openai" else object())
    text = dev.usage(8080, DEMO_MODEL)
    assert [c.split()[0] for c in printed_commands(text)] == ["curl", "curl"]
    assert "-m pip install openai" in text


def test_with_an_upstream_the_examples_name_its_model(gateway: Gateway) -> None:
    gateway.upstream.scripts["models"] = Script(body=json.dumps({"object": "list", "data": [
        {"id": "llama-3.1-8b-instruct", "object": "model"}, {"id": "other"}]}).encode())
    base = gateway.upstream.url + "/script/models"  # GET /script/models/v1/models answers with the script
    assert dev.example_model(base, demo=False) == "llama-3.1-8b-instruct"
    assert dev.example_model(base, demo=True) == DEMO_MODEL
    text = dev.usage(8080, dev.example_model(base, demo=False))
    assert '"model": "llama-3.1-8b-instruct"' in text and DEMO_MODEL not in text
    assert dev.upstream_model("http://127.0.0.1:9", timeout_s=1) is None  # nothing listens: a placeholder is printed
    assert "replace MODEL with a model the upstream serves" in dev.usage(8080, dev.MODEL_PLACEHOLDER)
