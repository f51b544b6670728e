"""Hostile configs (#19, #17): any YAML text and any parsed mapping gives a Config or a ConfigError
naming key paths, never another exception (a fuzzer found TypeError tracebacks)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.config import Config, ConfigError, load_config, parse_config
from extproc.config.load import _load_yaml

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _schema_keys(cls: type, out: set[str]) -> set[str]:
    for f in dataclasses.fields(cls):
        out.add(f.name)
        hint = get_type_hints(cls)[f.name]
        for tp in (hint, *getattr(hint, "__args__", ())):
            if dataclasses.is_dataclass(tp) and tp.__name__ not in out:
                out.add(tp.__name__)
                _schema_keys(tp, out)
    return out


KEYS = sorted(k for k in _schema_keys(Config, set()) if k[0].islower())
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["auto", "cpu", "header", "block", "warn", "standard", "premium", "keyword", "AND",
                     "127.0.0.1:1", "unix:/x", "http://x", "{score}", "{nope}", "", "0.0.0.0:50051"]),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers(), st.none(), st.booleans())
trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=6)), max_leaves=30)
configs = st.dictionaries(st.sampled_from(["server", "truthlens", "telemetry", "decisions", "x"]), trees, max_size=4)


@FUZZ
@given(configs)
def test_any_mapping_gives_a_config_or_a_config_error(mapping: dict[str, Any]) -> None:
    try:
        assert isinstance(parse_config(mapping), Config)
    except ConfigError as exc:
        assert exc.errors and all(isinstance(e, str) and ": " in e for e in exc.errors)


yaml_texts = st.one_of(
    st.text(alphabet="[]{}:,-?&*!|>'\"#%@` \n\tab01.", max_size=60),
    configs.map(lambda m: yaml.safe_dump(m, allow_unicode=True)),
)


@FUZZ
@given(yaml_texts)
def test_any_yaml_text_gives_a_config_or_a_config_error(text: str) -> None:
    try:
        parse_config(_load_yaml(text, "k.yaml"), "k.yaml")
    except ConfigError as exc:
        assert exc.errors


@pytest.mark.parametrize(("text", "error"), [
    ("[]:\n", "k.yaml: <root>: expected a string key, got a list as a key at line 1"),
    ("{a: 1}: 2\n", "k.yaml: <root>: expected a string key, got a mapping as a key at line 1"),
    ("server:\n  ? [1]\n  : 2\n", "server: expected a string key, got a list as a key at line 2"),
    ("decisions:\n- name: a\n  name: b\n", "decisions[0].name: expected unique keys in a mapping, got 'name' twice "
                                           "(lines 2 and 3)"),
    ("server: 2001-13-40\n", "k.yaml: expected valid YAML, got ValueError: month must be in 1..12"),
])
def test_odd_yaml_keys_are_config_errors_with_the_key_path(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load_yaml(text, "k.yaml")
    assert info.value.errors == (error,)


def test_recursive_aliases_do_not_hang() -> None:
    with pytest.raises(ConfigError):
        parse_config(_load_yaml("server: &a [*a]\n", "k.yaml"))


def test_check_config_reports_an_unhashable_key_without_a_traceback(tmp_path: Path) -> None:
    """The issue's reproduction: `printf '[]:\\n' > k.yaml; truthlens check-config k.yaml`."""
    k = tmp_path / "k.yaml"
    k.write_text("[]:\n")
    with pytest.raises(ConfigError):
        load_config(k)
    run = subprocess.run([sys.executable, "-m", "extproc.cli", "check-config", str(k)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "Traceback" not in run.stderr + run.stdout
    assert "expected a string key" in run.stdout + run.stderr
