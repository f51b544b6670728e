"""Engine settings for tests: the config's defaults (the only defaults there are), no model directories."""

from __future__ import annotations

from typing import Any

from extproc.config import default_config
from extproc.inference.engine import EngineSettings

NO_MODELS = dict(sentinel_dir=None, detector_dir=None, gpu_detector_dir=None, explainer_dir=None, surrogate_dir=None)


def engine_settings(**kw: Any) -> EngineSettings:
    """`EngineSettings.from_config(default config)` with no models unless `kw` names them, plus `kw`."""
    return EngineSettings.from_config(default_config(), **{**NO_MODELS, **kw})
