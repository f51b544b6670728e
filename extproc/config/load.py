"""Load and validate the TruthLens YAML config into frozen dataclasses.

Bad config must fail at startup with every problem named at once, so the
loader walks the schema (`extproc.config.schema`) collecting errors instead of
stopping at the first. Each error reads `<key.path>: expected <what>, got <value>`.
"""

from __future__ import annotations

import dataclasses
import string
from pathlib import Path
from typing import Any, Mapping

import yaml

from extproc.config.schema import CONDITION_KEYS, Config, ConditionConfig
from extproc.config.walk import SchemaWalker, show_value

WARNING_PLACEHOLDERS = ("score", "spans")


class ConfigError(Exception):
    """Every validation error of one config source, one `<key.path>: ...` line each."""

    def __init__(self, errors: list[str] | tuple[str, ...], source: str = "<config>") -> None:
        self.errors = tuple(errors)
        self.source = source
        super().__init__("\n".join(self.errors))


def load_config(path: str | Path, fill: Mapping[str, Any] | None = None) -> Config:
    """Read, parse and validate a YAML file; raises ConfigError naming every bad key.

    `fill`: dotted key -> value used where the file leaves that key unset or null (what a command line
    knows better than a default, e.g. `truthlens dev --upstream` for truthlens.modes.standard.upstream_url).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{source}: expected a readable file, got {exc.strerror or exc}"], source) from exc
    return parse_config(_load_yaml(text, source), source=source, fill=fill)


def parse_config(mapping: Mapping[str, Any] | None, source: str = "<config>",
                 fill: Mapping[str, Any] | None = None) -> Config:
    """Validate an already-parsed mapping (None = empty file = all defaults); `fill` as in load_config."""
    walker = SchemaWalker()
    mapping = {} if mapping is None else mapping
    for key, value in (fill or {}).items():
        if value is not None:
            mapping = _filled(mapping, key.split("."), value)
    cfg = walker.build(Config, mapping, "")
    if isinstance(cfg, Config):  # cross-field checks run even when some fields fell back to defaults
        reported = {e.partition(": ")[0] for e in walker.errors}  # a bad value fell back: say it once
        walker.errors.extend(e for e in _cross_checks(cfg) if e.partition(": ")[0] not in reported)
    if walker.errors:
        raise ConfigError(walker.errors, source)
    assert isinstance(cfg, Config)
    return cfg


def _filled(mapping: Any, keys: list[str], value: Any) -> Any:
    """A copy of `mapping` with keys[0]...keys[-1] set to `value` where unset or null; anything that is
    not a mapping on the way is left for the schema walker to report."""
    if not isinstance(mapping, Mapping):
        return mapping
    head, rest = keys[0], keys[1:]
    current = mapping.get(head)
    if rest:
        inner = _filled({} if current is None else current, rest, value)
    else:
        inner = value if current is None else current
    return {**mapping, head: inner}


def default_config() -> Config:
    return Config()


def model_dir(path: str | None) -> Path | None:
    """Model paths in the config are relative to the current working directory."""
    if path is None:
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


def modes_in_use(cfg: Config) -> set[str]:
    """The default mode and every decision's mode."""
    return {cfg.truthlens.default_mode} | {
        d.plugins.truthlens.mode for d in cfg.decisions if d.plugins.truthlens.mode is not None}


def mitigation_budget_s(cfg: Config, mode: str) -> float:
    """How long a standard/premium mitigation may take at worst (0 for lightweight), before the cap
    `server.envoy_max_message_timeout_s` (Envoy ignores a longer override)."""
    tl = cfg.truthlens
    detect_s = tl.inference_timeout_ms / 1000.0
    if mode == "standard":
        return tl.modes.standard.max_iterations * (tl.modes.standard.timeout_ms / 1000.0 + detect_s) + 5.0
    if mode == "premium":
        return tl.modes.premium.timeout_ms / 1000.0 + detect_s + 5.0
    return 0.0


def config_warnings(cfg: Config) -> list[str]:
    """Problems the gateway survives (it runs without models and reports detection unavailable)."""
    warnings = []
    cap = cfg.server.envoy_max_message_timeout_s
    for mode in sorted(modes_in_use(cfg)):
        budget = mitigation_budget_s(cfg, mode)
        if budget > cap:
            warnings.append(
                f"truthlens.modes.{mode}: a mitigation may take {budget:g} s, more than "
                f"server.envoy_max_message_timeout_s ({cap:g} s); it is cut off at the cap and keeps the first verdict"
            )
    inference = cfg.truthlens.inference
    if inference.remote:  # the pool's processes load the models, not this one
        if inference.deadline_ms >= cfg.truthlens.inference_timeout_ms:
            warnings.append(
                f"truthlens.inference.deadline_ms: {inference.deadline_ms} is not below truthlens.inference_timeout_ms "
                f"({cfg.truthlens.inference_timeout_ms}); a slow pool ends in a timeout instead of a retry"
            )
        return warnings
    models = cfg.truthlens.models
    for role, path in (("sentinel", models.sentinel), ("detector", models.detector_dirs[0]),
                       ("explainer", models.explainer)):  # detector auto: the CPU tier must be there
        p = model_dir(path)
        if p is not None and not p.is_dir():
            warnings.append(
                f"truthlens.models.{role}: model directory {str(p)!r} not found; "
                f"{role} unavailable until it exists"
            )
    return warnings


def config_to_dict(cfg: Any) -> Any:
    """Plain dict/list form of a config (what `check-config --print` dumps); parses back to an equal Config."""
    if isinstance(cfg, ConditionConfig):
        allowed = CONDITION_KEYS[cfg.type][0]
        return {"type": cfg.type} | {k: config_to_dict(getattr(cfg, k)) for k in sorted(allowed)}
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [config_to_dict(v) for v in cfg]
    return cfg


def check_warning_template(template: str) -> str | None:
    """None if `template` formats with only {score} and {spans}, else what was expected."""
    expected = "a format string using only {score} and {spans}"
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        if not fields <= set(WARNING_PLACEHOLDERS):
            return expected
        template.format(score=0.5, spans="'example'")
    except (ValueError, KeyError, IndexError, TypeError):
        return expected
    return None


# --- YAML ---------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose documents are checked (`_key_errors`) before anything is constructed."""


def _key_errors(root: yaml.Node | None) -> list[str]:
    """Every mapping key that is not a scalar, and every key given twice, each with its key path.

    Checked on the composed node tree, before construction: PyYAML would raise TypeError on an
    unhashable key (`[]: 1`) and silently keep the last of two equal keys. Aliases are walked once.
    """
    errors: list[str] = []
    seen_nodes: set[int] = set()
    todo: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while todo:
        node, path = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, yaml.ScalarNode):
                    kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                    errors.append(f"{path or '<root>'}: expected a string key, got {kind} as a key at line {line}")
                    continue
                sub = f"{path}.{key_node.value}" if path else str(key_node.value)
                ident = (key_node.tag, key_node.value)
                if ident in first:
                    errors.append(f"{sub}: expected unique keys in a mapping, got {key_node.value!r} twice "
                                  f"(lines {first[ident]} and {line})")
                else:
                    first[ident] = line
                todo.append((value_node, sub))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return sorted(errors)


def _load_yaml(text: str, source: str) -> Any:
    """Parse one YAML document; anything wrong with it is a ConfigError, never another exception."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        errors = _key_errors(node)
        if errors:
            raise ConfigError([f"{source}: {e}" if e.startswith("<root>") else e for e in errors], source)
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{source}: expected valid YAML, got {problem}{where}"], source) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # e.g. a timestamp like 2001-13-40
        raise ConfigError([f"{source}: expected valid YAML, got {type(exc).__name__}: {exc}"], source) from None
    finally:
        loader.dispose()


def _cross_checks(cfg: Config) -> list[str]:
    errors: list[str] = []
    tls = cfg.server.tls
    if tls.enabled:
        for key in ("cert_file", "key_file", "client_ca_file"):
            value = getattr(tls, key)
            if value is None and key != "client_ca_file":
                errors.append(f"server.tls.{key}: expected a file path when server.tls.enabled is true, got null")
            elif value is not None and not Path(value).expanduser().is_file():
                errors.append(f"server.tls.{key}: expected an existing file, got {value!r}")
    expected = check_warning_template(cfg.truthlens.warning_template)
    if expected:
        errors.append(f"truthlens.warning_template: expected {expected}, got {show_value(cfg.truthlens.warning_template)}")
    modes = cfg.truthlens.modes
    users = mode_users(cfg, "standard")
    if users and modes.standard.upstream_url is None:
        errors.append(f"truthlens.modes.standard.upstream_url: expected the URL of the LLM that standard mode re-asks "
                      f"(standard is used by {', '.join(users)}), got null")
    users = mode_users(cfg, "premium")
    if users and not modes.premium.verifiers:
        errors.append(f"truthlens.modes.premium.verifiers: expected at least one verifier "
                      f"(premium is used by {', '.join(users)}), got []")
    return errors


def mode_users(cfg: Config, mode: str) -> list[str]:
    """The keys that select `mode`: truthlens.default_mode (a decision without a mode inherits it) and
    every enabled decision's plugins.truthlens.mode."""
    users = ["truthlens.default_mode"] if cfg.truthlens.default_mode == mode else []
    for i, d in enumerate(cfg.decisions):
        plugin = d.plugins.truthlens
        if plugin.mode == mode and plugin.enabled is not False:
            users.append(f"decisions[{i}].plugins.truthlens.mode")
    return users
