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
