"""Config -> the long-lived objects one sidecar process shares across streams.

Built once at start-up (compiled policy, engine, metrics), immutable afterwards: the per-request
state lives only in `RequestContext`.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extproc.config import Config, model_dir
from extproc.inference.api import Engine, NullEngine
from extproc.inference.calibration import CalibrationError
from extproc.inference.upstream import WriterFusion
from extproc.policy.decisions import Policy, compile_policy
from extproc.protocol.grounding import GroundingRules, GroundingSettings

log = logging.getLogger("truthlens.wiring")


@dataclass(slots=True)
class GatewayRuntime:
    """What every stream reads: config, compiled policy, the engine, metrics (optional)."""

    config: Config
    engine: Engine
    policy: Policy = field(init=False)
    grounding: GroundingRules = field(init=False)  # where request documents are looked for
    metrics: Any = None  # extproc.telemetry.metrics.Metrics, or None in tests
    mitigator: Any = None  # extproc.gateway.mitigation.Mitigator for standard/premium modes
    writer_fusion: WriterFusion | None = field(init=False)  # truthlens.signals.upstream_fusion

    def __post_init__(self) -> None:
        self.policy = compile_policy(self.config)
        self.grounding = grounding_rules(self.config)
        self.writer_fusion = writer_fusion(self.config)

    @property
    def inference_timeout_s(self) -> float:
        return self.config.truthlens.inference_timeout_ms / 1000.0


class StartupError(ValueError):
    """A configured file that cannot be used: the message names the config key."""


def writer_fusion(cfg: Config) -> WriterFusion | None:
    """The `truthlens.signals.upstream_fusion` fits, or None; a file that cannot be used stops start-up."""
    path = cfg.truthlens.signals.upstream_fusion
    if path is None:
        return None
    try:
        fusion = WriterFusion.load(Path(path).expanduser())
    except CalibrationError as exc:
        raise StartupError(f"truthlens.signals.upstream_fusion: {exc}") from exc
    log.info("upstream_fusion: writer fits for %s", sorted(fusion.fits))
    return fusion


def grounding_rules(cfg: Config) -> GroundingRules:
    """`truthlens.grounding` compiled for the protocol layer (which reads no config)."""
    g = cfg.truthlens.grounding
    return GroundingRules(GroundingSettings(
        system_prompt=g.system_prompt, user_sections=g.user_sections, tool_results=g.tool_results,
        context_field=g.context_field, section_labels=g.section_labels, question_labels=g.question_labels,
        tags=g.tags, patterns=g.patterns))


def build_engine(cfg: Config) -> Engine:
    """The inference engine for this config: a remote detector pool (`truthlens.inference.remote`, no
    local model is loaded) or the local models (`build_local_engine`)."""
    if cfg.truthlens.inference.remote:
        from extproc.api.client import RemoteEngine

        return RemoteEngine.from_config(cfg)
    return build_local_engine(cfg)


def build_local_engine(cfg: Config) -> Engine:
    """The engine over the local model directories (`truthlens.models`).

    Missing or invalid model directories are not fatal (the engine logs them, naming the config
    key, and leaves the role out; the gateway answers unchecked/models_unavailable). Only errors
    the engine raises (e.g. provider `cuda` without a GPU) stop start-up.
    """
    m = cfg.truthlens.models
    if all(model_dir(getattr(m, role)) is None for role in ("sentinel", "detector", "explainer")):
        return NullEngine()
    try:
        engine_mod = importlib.import_module("extproc.inference.engine")
    except ImportError as exc:
        log.warning("inference engine not available (%s): detection disabled", exc)
        return NullEngine()
    return engine_mod.build_engine(engine_settings(cfg, engine_mod))


def engine_settings(cfg: Config, engine_mod: Any) -> Any:
    """Config -> EngineSettings (the inference layer owns the mapping: `EngineSettings.from_config`)."""
    return engine_mod.EngineSettings.from_config(cfg)


def build_mitigator(cfg: Config, engine: Engine, metrics: Any = None) -> Any:
    """The standard/premium mode driver, or None when no decision can use those modes; `metrics` counts
    its rewrites and verifier calls."""
    modes = {cfg.truthlens.default_mode} | {
        d.plugins.truthlens.mode for d in cfg.decisions if d.plugins.truthlens.mode is not None
    }
    if modes <= {"lightweight"}:
        return None
    from extproc.gateway.mitigation import Mitigator

    return Mitigator(cfg, engine, metrics=metrics)
