"""`truthlens check-config`: OK + warnings / every error with exit 1 / --print round trip."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from extproc.commands import check_config
from extproc.config import load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "truthlens.example.yaml"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    check_config.add_arguments(parser)
    return check_config.run(parser.parse_args(list(argv)))


def test_valid_config_prints_ok_and_model_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # relative model dirs resolve here, where none exist
    assert run(str(EXAMPLE)) == 0
    out, err = capsys.readouterr()
    assert out == f"OK: {EXAMPLE}\n"
    assert "warning: truthlens.models.detector: model directory" in err
    assert err.count("warning:") == 3


def test_invalid_config_lists_every_error_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("truthlens:\n  default_mode: fast\n  thresholds: {token: 3}\nserver: {grpc_adress: x}\n")
    assert run(str(path)) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[:3] == [
        "server.grpc_adress: expected a known key (did you mean 'grpc_address'?), got unknown key 'grpc_adress'",
        "truthlens.default_mode: expected one of lightweight | standard | premium, got 'fast'",
        "truthlens.thresholds.token: expected a number in [0, 1], got 3",
    ]
    assert lines[3] == f"INVALID: {path} (3 errors)"


def test_print_dumps_effective_config_that_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "small.yaml"
    path.write_text("truthlens:\n  default_action: block\n")
    assert run(str(path), "--print") == 0
    out, _ = capsys.readouterr()
    dumped = yaml.safe_load(out)
    assert dumped["truthlens"]["default_action"] == "block"
    assert dumped["server"]["grpc_address"] == "127.0.0.1:50051"  # defaults filled in
    assert parse_config(dumped) == load_config(path)


@pytest.mark.parametrize(("text", "key"), [
    ("truthlens:\n  default_mode: standard\n", "truthlens.modes.standard.upstream_url"),
    ("truthlens:\n  default_mode: premium\n", "truthlens.modes.premium.verifiers"),
])
def test_modes_without_their_llms_are_refused_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str) -> None:
    """check-config and serve refuse what used to be a silent no-op (#17): the key comes first."""
    path = tmp_path / "mode.yaml"
    path.write_text(text)
    assert run(str(path)) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{key}: expected ") and "truthlens.default_mode" in err[0]
    assert err[1] == f"INVALID: {path} (1 error)"
    from extproc.commands import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(["--config", str(path)])) == 2  # before anything starts
    err = capsys.readouterr().err
    assert f"  {key}: expected " in err


def test_upstream_url_fills_what_the_file_leaves_null(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`truthlens dev --upstream URL` passes the LLM it fronts as `serve --upstream-url`; check-config takes it too."""
    path = tmp_path / "standard.yaml"
    path.write_text("truthlens:\n  default_mode: standard\n")
    assert run(str(path), "--upstream-url", "http://127.0.0.1:8000", "--print") == 0
    dumped = yaml.safe_load(capsys.readouterr().out)
    assert dumped["truthlens"]["modes"]["standard"]["upstream_url"] == "http://127.0.0.1:8000"


async def test_serve_probes_the_llms_at_startup_and_warns_naming_the_key() -> None:
    """Unreachable at startup is a warning, not a crash loop: the LLM may be briefly down at deploy time."""
    import asyncio

    from extproc.devtools.processes import free_port
    from extproc.gateway.mitigation import probe_llms

    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    live = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    dead = f"http://127.0.0.1:{free_port()}"
    verifiers = [{"name": "a", "base_url": live + "/v1", "model": "m"}, {"name": "b", "base_url": dead, "model": "m"}]
    cfg = parse_config({"truthlens": {"default_mode": "standard", "modes": {
        "standard": {"upstream_url": dead}, "premium": {"verifiers": verifiers}}},
        "decisions": [{"name": "p", "rules": {"conditions": [{"type": "header", "name": "x-p"}]},
                       "plugins": {"truthlens": {"mode": "premium"}}}]})
    warnings = await probe_llms(cfg, timeout_s=1.0)
    assert [w.split(":")[0] for w in warnings] == [
        "truthlens.modes.standard.upstream_url", "truthlens.modes.premium.verifiers[1].base_url"]
    assert f"{dead} is not reachable at startup" in warnings[0] and "x-truthlens-refined: false" in warnings[0]
    assert await probe_llms(parse_config({})) == []  # lightweight calls no LLM
    server.close()
    await server.wait_closed()


def test_dev_refuses_a_mode_without_its_llms_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`truthlens dev` fills standard's upstream_url with the LLM it fronts, but no verifier for premium."""
    import signal
    import subprocess

    from extproc.commands import dev

    started: list[object] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))  # nothing may start
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # dev.run installs SIGINT/SIGTERM handlers
    path = tmp_path / "premium.yaml"
    path.write_text("truthlens:\n  default_mode: premium\n")
    parser = argparse.ArgumentParser()
    dev.add_arguments(parser)
    args = parser.parse_args(["--config", str(path), "--upstream", "http://127.0.0.1:1", "--envoy-bin", "/bin/true"])
    assert dev.run(args) == 2
    err = capsys.readouterr().err
    assert "  truthlens.modes.premium.verifiers: expected at least one verifier" in err
    assert started == []


def test_serve_refuses_an_unusable_writer_fit_naming_the_key(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """truthlens.signals.upstream_fusion: a file that is not a writer fit stops start-up before any model loads."""
    from extproc.commands import serve

    (tmp_path / "fits.json").write_text('{"a": 1.0, "b": 0.0, "raw_score": "fused"}')
    path = tmp_path / "fusion.yaml"
    path.write_text(f"truthlens:\n  signals:\n    upstream_fusion: {tmp_path / 'fits.json'}\n"
                    "  models: {sentinel: null, detector: null, explainer: null, surrogate: null}\n")
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(["--config", str(path), "--no-metrics"])) == 2
    assert "truthlens.signals.upstream_fusion: " in capsys.readouterr().err
