"""The committed envoy/local.yaml and every rendering of it pass `envoy --mode validate`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from extproc.devtools.envoy_config import TEMPLATE, EnvoyOptions, render, resolve_envoy_binary, write_config

pytestmark = pytest.mark.e2e


def validate(path: Path) -> None:
    r = subprocess.run([resolve_envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def ext_proc_filter(cfg: dict) -> dict | None:
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return next((f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"), None)


def test_committed_local_yaml_is_valid_and_deliberate() -> None:
    validate(TEMPLATE)
    ext = ext_proc_filter(yaml.safe_load(TEMPLATE.read_text()))
    assert ext["allow_mode_override"] is True
    assert ext["failure_mode_allow"] is True
    assert ext["message_timeout"] == "10s"
    mode = ext["processing_mode"]
    assert (mode["request_header_mode"], mode["response_header_mode"]) == ("SEND", "SEND")
    assert (mode["request_body_mode"], mode["response_body_mode"]) == ("BUFFERED", "BUFFERED")
    assert mode["response_trailer_mode"] == "SKIP"


@pytest.mark.parametrize(
    "opts",
    [
        EnvoyOptions(listen_port=18080, admin_port=19901, sidecar_address="127.0.0.1:15051",
                     upstream_url="http://127.0.0.1:18000", failure_mode_allow=False, message_timeout_s=2.5),
        EnvoyOptions(upstream_url="https://api.openai.com"),
        EnvoyOptions(sidecar_address="unix:/tmp/truthlens.sock", upstream_url="http://llm.internal:9000"),
        EnvoyOptions(with_ext_proc=False),
    ],
    ids=["ports-fail-closed", "https-upstream", "unix-sidecar", "bare"],
)
def test_rendered_configs_validate(tmp_path: Path, opts: EnvoyOptions) -> None:
    path = write_config(opts, tmp_path / "envoy.yaml")
    validate(path)
    cfg = render(opts)
    ext = ext_proc_filter(cfg)
    if opts.with_ext_proc:
        assert ext["failure_mode_allow"] is opts.failure_mode_allow
    else:
        assert ext is None
        assert [c["name"] for c in cfg["static_resources"]["clusters"]] == ["upstream_llm"]
    up = cfg["static_resources"]["clusters"][-1]
    assert ("transport_socket" in up) == opts.upstream_url.startswith("https")


def test_bad_upstream_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="upstream URL"):
        render(EnvoyOptions(upstream_url="ftp://x"))
