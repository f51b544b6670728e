"""One scripted upstream + in-process sidecar (test engine) + real Envoy for the e2e package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pytest

from extproc.config import parse_config
from extproc.devtools.demo_upstream import DemoUpstreamServer, start_demo_upstream
from extproc.gateway.service import TruthLensService
from extproc.gateway.wiring import GatewayRuntime, build_mitigator
from tests.e2e.harness import EnvoyProcess, ScriptedTestEngine, SidecarThread


ACTION_DECISIONS = [
    {"name": f"action-{a}", "priority": 10,
     "rules": {"conditions": [{"type": "header", "name": "x-tl-action", "value": a}]},
     "plugins": {"truthlens": {"action": a}}}
    for a in ("warn", "block", "none")
]
DECISIONS = ACTION_DECISIONS + [
    {"name": "off", "priority": 20,
     "rules": {"conditions": [{"type": "header", "name": "x-tl-disable"}]},
     "plugins": {"truthlens": {"enabled": False}}},
    {"name": "hold", "priority": 15,
     "rules": {"conditions": [{"type": "header", "name": "x-tl-hold", "value": "sentence"}]},
     "plugins": {"truthlens": {"hold_back": "sentence"}}},
    {"name": "hold-block", "priority": 16,
     "rules": {"conditions": [{"type": "header", "name": "x-tl-hold", "value": "block"}]},
     "plugins": {"truthlens": {"hold_back": "sentence", "action": "block"}}},
    {"name": "upstream-lp", "priority": 17,
     "rules": {"conditions": [{"type": "header", "name": "x-tl-logprobs"}]},
     "plugins": {"truthlens": {"upstream_logprobs": True}}},
    {"name": "refine", "priority": 5,
     "rules": {"conditions": [{"type": "header", "name": "x-tl-mode", "value": "standard"}]},
     "plugins": {"truthlens": {"mode": "standard"}}},
]


def e2e_config(upstream_url: str) -> dict:
    """Decisions keyed on request headers so each test picks its action/mode deterministically."""
    return {
        "truthlens": {"default_action": "header", "inference_timeout_ms": 1500,
                      "modes": {"standard": {"upstream_url": upstream_url, "max_iterations": 2}}},
        "decisions": DECISIONS,
    }


@dataclass
class Gateway:
    upstream: DemoUpstreamServer
    sidecar: SidecarThread
    service: TruthLensService
    engine: ScriptedTestEngine
    envoy: EnvoyProcess

    @property
    def base_url(self) -> str:
        return self.envoy.base_url


@pytest.fixture(scope="package")
def gateway() -> Iterator[Gateway]:
    upstream = start_demo_upstream(chunk_delay_s=0.005)
    engine = ScriptedTestEngine()
    cfg = parse_config(e2e_config(upstream.url))
    service = TruthLensService(GatewayRuntime(cfg, engine, mitigator=build_mitigator(cfg, engine)))
    sidecar = SidecarThread(service).start()
    envoy = EnvoyProcess(sidecar.address, upstream.url).start()
    try:
        yield Gateway(upstream, sidecar, service, engine, envoy)
    finally:
        envoy.stop()
        if service.rt.mitigator is not None:
            sidecar.call(service.rt.mitigator.close())
        sidecar.stop()
        upstream.stop()
