"""Decision selection: priority, AND/OR, keyword/domain/header conditions, inheritance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extproc.config import ConfigError, load_config, parse_config
from extproc.policy.decisions import (
    Decision,
    RequestFacts,
    compile_policy,
    keyword_pattern,
    normalize_host,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "truthlens.example.yaml"


def decision(name: str, priority: int, conditions: list[dict[str, Any]], operator: str = "OR", **plugin: Any) -> dict[str, Any]:
    return {
        "name": name,
        "priority": priority,
        "rules": {"operator": operator, "conditions": conditions},
        "plugins": {"truthlens": plugin},
    }


def facts(question: str = "", host: str = "api.example.com", **headers: str) -> RequestFacts:
    pairs = [(":authority", host)] + [(k.replace("_", "-"), v) for k, v in headers.items()]
    return RequestFacts.from_headers(pairs, question)


def test_example_config_decisions() -> None:
    cfg = load_config(EXAMPLE)
    medical = compile_policy(cfg).select(facts("What dosage of ibuprofen is safe?"))
    assert medical == Decision("medical", True, "lightweight", 0.4, "warn")
    assert compile_policy(cfg).select(facts("hello", host="medical.example.com:443")).name == "medical"
    internal = compile_policy(cfg).select(facts("hello", x_team="platform"))
    assert internal.name == "internal-tools" and internal.enabled is False
    # unset fields inherit the global settings
    response = cfg.truthlens.thresholds.response
    assert (internal.mode, internal.threshold, internal.action) == ("lightweight", response, "header")
    default = compile_policy(cfg).select(facts("hello", x_team="data"))
    assert default == Decision(None, True, "lightweight", response, "header")


def test_priority_highest_first_then_file_order() -> None:
    header = [{"type": "header", "name": "x-a"}]
    cfg = parse_config(
        {"decisions": [decision("low", 1, header), decision("high", 10, header), decision("high-too", 10, header)]}
    )
    assert compile_policy(cfg).select(facts(x_a="1")).name == "high"


def test_and_requires_every_condition_or_needs_one() -> None:
    conds = [{"type": "keyword", "keywords": ["invoice"]}, {"type": "domain", "domains": ["billing.example.com"]}]
    for op, both, only_kw, only_domain in (("AND", True, False, False), ("OR", True, True, True)):
        cfg = parse_config({"decisions": [decision("d", 1, conds, operator=op)]})
        assert (compile_policy(cfg).select(facts("my invoice", host="billing.example.com")).name == "d") is both
        assert (compile_policy(cfg).select(facts("my invoice")).name == "d") is only_kw
        assert (compile_policy(cfg).select(facts("hi", host="billing.example.com")).name == "d") is only_domain


@pytest.mark.parametrize(
    ("question", "hit"),
    [
        ("What is the DOSAGE?", True),
        ("dosage", True),
        ("(dosage)", True),
        ("dosages", False),  # whole words only
        ("overdosage", False),
        ("is C++ fast", True),  # keywords with symbols still match on word edges
        ("is c++11 fast", False),
        ("side   effects of it", True),  # whitespace inside a phrase is flexible
        ("sideeffects", False),
        ("", False),
    ],
)
def test_keyword_matching(question: str, hit: bool) -> None:
    pattern = keyword_pattern(["dosage", "C++", "side effects"])
    assert (pattern.search(question) is not None) is hit


@pytest.mark.parametrize(
    ("host", "hit"),
    [
        ("example.com", True),
        ("EXAMPLE.com:8443", True),
        ("api.example.com", True),
        ("a.b.example.com.", True),
        ("badexample.com", False),  # suffix must be on a label boundary
        ("example.com.evil.net", False),
        ("", False),
    ],
)
def test_domain_matching(host: str, hit: bool) -> None:
    cfg = parse_config({"decisions": [decision("d", 1, [{"type": "domain", "domains": ["Example.com"]}])]})
    assert (compile_policy(cfg).select(facts(host=host)).name == "d") is hit


def test_host_header_is_used_without_authority() -> None:
    cfg = parse_config({"decisions": [decision("d", 1, [{"type": "domain", "domains": ["example.com"]}])]})
    assert compile_policy(cfg).select(RequestFacts.from_headers([("Host", "example.com")])).name == "d"


def test_normalize_host() -> None:
    assert normalize_host("[::1]:8080") == "::1"
    assert normalize_host("Example.COM.:443") == "example.com"


def test_header_conditions_name_case_insensitive_value_exact() -> None:
    cfg = parse_config(
        {
            "decisions": [
                decision("exact", 2, [{"type": "header", "name": "X-Team", "value": "Platform"}]),
                decision("present", 1, [{"type": "header", "name": "x-debug"}]),
            ]
        }
    )
    assert compile_policy(cfg).select(RequestFacts.from_headers([("x-team", "Platform")])).name == "exact"
    assert compile_policy(cfg).select(RequestFacts.from_headers([("X-TEAM", "platform")])).name is None
    assert compile_policy(cfg).select(RequestFacts.from_headers([("X-Debug", "")])).name == "present"
    # repeated headers are joined, so an exact match needs the whole value
    assert compile_policy(cfg).select(RequestFacts.from_headers([("x-team", "Platform"), ("x-team", "b")])).name is None


def test_per_decision_overrides_and_global_defaults() -> None:
    cfg = parse_config(
        {
            "truthlens": {"enabled": False, "default_mode": "standard", "default_action": "warn", "thresholds": {"response": 0.7},
                          "modes": {"standard": {"upstream_url": "http://llm:8000"},
                                    "premium": {"verifiers": [{"name": "v", "base_url": "http://v:8000", "model": "m"}]}}},
            "decisions": [
                decision("on", 1, [{"type": "header", "name": "x-on"}], enabled=True, mode="premium", threshold=0.2, action="block")
            ],
        }
    )
    assert compile_policy(cfg).select(facts(x_on="1")) == Decision("on", True, "premium", 0.2, "block")
    assert compile_policy(cfg).select(facts()) == Decision(None, False, "standard", 0.7, "warn")


def test_policy_compiled_once_per_config() -> None:
    cfg = load_config(EXAMPLE)
    assert compile_policy(cfg) is compile_policy(cfg)
    assert compile_policy(cfg).uses_question is True
    assert compile_policy(parse_config({})).uses_question is False


def test_decide_from_headers_matches_select_and_defaults_without_decisions() -> None:
    cfg = load_config(EXAMPLE)
    policy = compile_policy(cfg)
    headers = {":authority": "api.example.com", "x-team": "platform"}
    assert policy.decide(headers, "hello") == policy.select(RequestFacts.from_headers(headers.items(), "hello"))
    assert policy.decide(headers, "hello").name == "internal-tools"
    assert policy.decide({":authority": "a"}, "What dosage of ibuprofen is safe?").name == "medical"
    bare = compile_policy(parse_config({"truthlens": {"default_action": "warn"}}))
    assert bare.decide({"x-team": "platform"}, "anything") is bare.default and bare.default.action == "warn"


def test_a_decision_can_restrict_the_white_box_signals() -> None:
    cfg = parse_config({"decisions": [
        {"name": "fast", "rules": {"conditions": [{"type": "header", "name": "x-fast"}]},
         "plugins": {"truthlens": {"signals": []}}},
        {"name": "pmi", "rules": {"conditions": [{"type": "header", "name": "x-pmi"}]},
         "plugins": {"truthlens": {"signals": ["context_pmi"]}}},
    ]})
    assert compile_policy(cfg).select(facts(x_fast="1")).signals == frozenset()  # no surrogate pass on this route
    assert compile_policy(cfg).select(facts(x_pmi="1")).signals == frozenset({"context_pmi"})
    assert compile_policy(cfg).select(facts()).signals is None  # no decision: every signal that is on globally
    with pytest.raises(ConfigError, match=r"decisions\[0\].plugins.truthlens.signals\[0\]"):
        parse_config({"decisions": [{"name": "x", "rules": {"conditions": [{"type": "header", "name": "x"}]},
                                     "plugins": {"truthlens": {"signals": ["perplexity"]}}}]})
