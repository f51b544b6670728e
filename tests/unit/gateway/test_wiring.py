"""Config -> engine: the sidecar starts with whatever models exist (what `make run` relies on)."""

from __future__ import annotations

from pathlib import Path

from extproc.config import parse_config
from extproc.inference.api import NullEngine
from extproc.gateway.wiring import build_engine


def cfg_for(sentinel: Path | None, detector: Path | None):
    return parse_config({"truthlens": {"models": {
        "sentinel": str(sentinel) if sentinel else None, "detector": str(detector) if detector else None,
        "explainer": None}}})


def test_no_models_configured_gives_null_engine() -> None:
    assert isinstance(build_engine(cfg_for(None, None)), NullEngine)


async def test_directory_with_only_training_config_is_an_unavailable_role(tmp_path: Path, tiny_models) -> None:
    unbuilt = tmp_path / "sentinel"
    unbuilt.mkdir()
    (unbuilt / "train.yaml").write_text("epochs: 1\n")
    engine = build_engine(cfg_for(unbuilt, tiny_models["bert-token"]))
    try:
        assert not engine.has("sentinel")
        assert engine.has("detector")
    finally:
        await engine.close()
