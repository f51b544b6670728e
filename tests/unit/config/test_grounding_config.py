"""truthlens.grounding: defaults, validation naming the key, and what the gateway builds from it."""

from __future__ import annotations

import pytest

from extproc.config import ConfigError, default_config, parse_config
from extproc.gateway.wiring import grounding_rules


def errors_of(mapping: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(mapping)
    return list(info.value.errors)


def test_defaults_find_documents_everywhere() -> None:
    g = default_config().truthlens.grounding
    assert (g.system_prompt, g.user_sections, g.tool_results, g.context_field, g.check_when_grounded) == (True,) * 5
    assert {"context", "documents", "sources"} <= set(g.section_labels) and "question" in g.question_labels
    assert {"documents", "document", "context", "source"} <= set(g.tags) and g.patterns == ()


def test_bad_values_fail_at_startup_naming_the_key() -> None:
    assert errors_of({"truthlens": {"grounding": {
        "patterns": ["ok (?P<doc>.*)", "(unclosed"], "tags": ["<documents>"], "section_labels": ["  "],
        "user_sections": "yes", "check_when_grounded": None}}}) == [
        "truthlens.grounding.user_sections: expected true or false, got 'yes'",
        "truthlens.grounding.section_labels[0]: expected a non-empty string, got '  '",
        "truthlens.grounding.tags[0]: expected a tag name without brackets, like documents, got '<documents>'",
        "truthlens.grounding.patterns[1]: expected a valid regular expression (missing ), unterminated subpattern "
        "at position 0), got '(unclosed'",
        "truthlens.grounding.check_when_grounded: expected true or false, got null",
    ]
    assert errors_of({"decisions": [{"name": "d", "rules": {"conditions": [{"type": "header", "name": "x"}]},
                                     "plugins": {"truthlens": {"check_when_grounded": 1}}}]}) == [
        "decisions[0].plugins.truthlens.check_when_grounded: expected true or false or null, got 1"]


def test_the_gateway_compiles_the_configured_layouts() -> None:
    cfg = parse_config({"truthlens": {"grounding": {"section_labels": ["kb"], "tool_results": False,
                                                    "patterns": [r"@@(?P<doc>[^@]+)@@"]}}})
    rules = grounding_rules(cfg)
    assert rules.settings.tool_results is False
    assert rules.split("KB: a fact.\nQuestion: q?") == (["a fact."], "Question: q?")
    assert rules.split("@@a doc@@ q?") == (["a doc"], "q?")
