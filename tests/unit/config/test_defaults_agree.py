"""Every default lives in the config schema. Where a copy must exist outside Python (the Envoy
configs, the Helm chart's values), these tests fail as soon as it disagrees."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from extproc.config import default_config, mitigation_budget_s
from extproc.devtools.envoy_config import EnvoyOptions, render
from tests.helpers.envoy_yaml import ext_proc_filters

ROOT = Path(__file__).resolve().parents[3]
ENVOY_CONFIGS = [ROOT / "envoy" / "local.yaml", ROOT / "envoy" / "production.yaml"]
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", duration)
    assert m, duration
    return float(m.group(1)) * UNITS[m.group(2)]


@pytest.mark.parametrize("path", ENVOY_CONFIGS, ids=lambda p: p.name)
def test_envoy_configs_use_the_config_timeouts(path: Path) -> None:
    cfg = default_config()
    filters = list(ext_proc_filters(yaml.safe_load(path.read_text())))
    assert filters
    for f in filters:
        assert seconds(f["max_message_timeout"]) == cfg.server.envoy_max_message_timeout_s
        # Envoy's per-message timer must outlast the sidecar's own inference timeout (which answers "unchecked")
        assert seconds(f["message_timeout"]) > cfg.truthlens.inference_timeout_ms / 1000.0


def test_helm_values_use_the_config_timeouts() -> None:
    values = yaml.safe_load((ROOT / "k8s" / "helm" / "truthlens" / "values.yaml").read_text())
    cfg = default_config()
    assert seconds(values["envoy"]["maxMessageTimeout"]) == cfg.server.envoy_max_message_timeout_s
    assert seconds(values["envoy"]["messageTimeout"]) > cfg.truthlens.inference_timeout_ms / 1000.0


@pytest.mark.parametrize("mode", ["standard", "premium"])
def test_default_mitigation_fits_under_the_envoy_cap(mode: str) -> None:
    cfg = default_config()
    assert 0 < mitigation_budget_s(cfg, mode) <= cfg.server.envoy_max_message_timeout_s


def test_dev_envoy_rendering_takes_the_cap_from_the_config() -> None:
    (f,) = ext_proc_filters(render(EnvoyOptions(max_message_timeout_s=42)))
    assert f["max_message_timeout"] == "42s"
    (f,) = ext_proc_filters(render(EnvoyOptions()))
    assert seconds(f["max_message_timeout"]) == default_config().server.envoy_max_message_timeout_s


def test_a_mode_slower_than_the_envoy_cap_is_warned_about() -> None:
    from extproc.config import config_warnings, parse_config

    slow = parse_config({"truthlens": {"default_mode": "standard", "modes": {"standard": {
        "timeout_ms": 60000, "upstream_url": "http://llm:8000"}}}})
    assert any(w.startswith("truthlens.modes.standard: a mitigation may take 135 s") for w in config_warnings(slow))
    assert not any("modes." in w for w in config_warnings(default_config()))


def test_engine_settings_have_no_defaults_of_their_own() -> None:
    """The inference layer gets its values from the config: only what the config does not set has a default."""
    from dataclasses import MISSING, fields

    from extproc.inference.engine import EngineSettings

    assert {f.name for f in fields(EngineSettings) if f.default is not MISSING} == {"prep_threads", "strict",
                                                                                     "float_twins"}
    cfg = default_config()
    s, t = EngineSettings.from_config(cfg), cfg.truthlens.thresholds
    assert (s.sentinel_threshold, s.token_threshold, s.response_threshold) == (t.sentinel, t.token, t.response)
    assert s.max_wait_ms == cfg.truthlens.batching.max_wait_ms and (s.detector_dir, s.gpu_detector_dir) == cfg.truthlens.models.detector_dirs
    with pytest.raises(TypeError, match="no field"):
        EngineSettings.from_config(cfg, token_treshold=0.3)  # a typo is an error, not a silent default
