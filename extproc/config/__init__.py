"""The TruthLens config: schema (every default, once), value checks, loading and validation.

Callers import from here: `from extproc.config import Config, load_config`.
"""

from extproc.config.load import (
    WARNING_PLACEHOLDERS,
    ConfigError,
    check_warning_template,
    config_to_dict,
    config_warnings,
    default_config,
    load_config,
    mitigation_budget_s,
    mode_users,
    model_dir,
    modes_in_use,
    parse_config,
)
from extproc.config.schema import *  # noqa: F403
from extproc.config.schema import __all__ as _schema_all

__all__ = [
    "WARNING_PLACEHOLDERS", "ConfigError", "check_warning_template", "config_to_dict", "config_warnings",
    "default_config", "load_config", "mitigation_budget_s", "mode_users", "model_dir", "modes_in_use", "parse_config", *_schema_all,
]
