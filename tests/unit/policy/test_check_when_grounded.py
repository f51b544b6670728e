"""`check_when_grounded`: global under truthlens.grounding, overridable per decision."""

from __future__ import annotations

from extproc.config import parse_config
from extproc.policy.decisions import compile_policy


def test_global_default_and_per_decision_override() -> None:
    rule = {"conditions": [{"type": "header", "name": "x-sentinel-first"}]}
    cfg = parse_config({"decisions": [{"name": "sentinel-first", "rules": rule,
                                       "plugins": {"truthlens": {"check_when_grounded": False}}},
                                      {"name": "inherit", "rules": {"conditions": [{"type": "header", "name": "x-i"}]}}]})
    policy = compile_policy(cfg)
    assert policy.default.check_when_grounded is True
    assert policy.decide({"x-sentinel-first": "1"}).check_when_grounded is False
    assert policy.decide({"x-i": "1"}).check_when_grounded is True
    off = compile_policy(parse_config({"truthlens": {"grounding": {"check_when_grounded": False}}}))
    assert off.default.check_when_grounded is False
