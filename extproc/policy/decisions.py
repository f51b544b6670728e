"""Pick the decision (per-route plugin settings) for one request.

Rules are compiled once per Config (regexes, normalised domains and header
names) so a request costs only the matching itself. Decisions are tried in
priority order, highest first (ties keep file order); the first whose rules
match wins, and no match means the global `truthlens` settings apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from extproc.config import Config, ConditionConfig, DecisionConfig, TruthLensConfig

_Matcher = Callable[["RequestFacts"], bool]


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What rules may look at. Header names lower-case; repeated headers joined with ','."""

    headers: Mapping[str, str] = field(default_factory=dict)
    host: str = ""  # :authority or host, lower-case, port and trailing dot removed
    question: str = ""  # the last user message (keyword conditions read it)

    @classmethod
    def from_headers(cls, headers: Iterable[tuple[str, str]], question: str | None = None) -> RequestFacts:
        joined: dict[str, str] = {}
        for name, value in headers:
            key = name.lower()
            joined[key] = f"{joined[key]},{value}" if key in joined else value
        authority = joined.get(":authority") or joined.get("host") or ""
        return cls(headers=joined, host=normalize_host(authority), question=question or "")


@dataclass(frozen=True, slots=True)
class Decision:
    """Effective per-request settings: decision overrides on top of the global defaults."""

    name: str | None  # None: no decision matched, global settings
    enabled: bool
    mode: str  # lightweight | standard | premium
    threshold: float  # response score at or above which the answer counts as detected
    action: str  # header | warn | block | none
    signals: frozenset[str] | None = None  # white-box signals allowed here; None = all that are on globally
    check_when_grounded: bool = True  # a request with documents skips the sentinel and is always checked
    hold_back: str = "none"  # streams: none | sentence (truthlens.stream.hold_back)
    upstream_logprobs: bool = False  # ask the upstream for its token logprobs (truthlens.signals.upstream_logprobs)


def normalize_host(authority: str) -> str:
    host = authority.strip().lower()
    if host.startswith("["):  # [v6]:port
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def keyword_pattern(keywords: Iterable[str]) -> re.Pattern[str]:
    """Whole-word, case-insensitive; lookarounds instead of \\b so 'c++' or '.net' still match."""
    alternatives = sorted({k.strip() for k in keywords if k.strip()}, key=len, reverse=True)
    body = "|".join(r"\s+".join(re.escape(part) for part in k.split()) for k in alternatives)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE)


def _condition_matcher(cond: ConditionConfig) -> _Matcher:
    if cond.type == "keyword":
        search = keyword_pattern(cond.keywords).search
        return lambda facts: search(facts.question) is not None
    if cond.type == "domain":
        domains = tuple(d.lower().rstrip(".") for d in cond.domains)
        suffixes = tuple("." + d for d in domains)
        return lambda facts: facts.host in domains or facts.host.endswith(suffixes)
    name, value = (cond.name or "").lower(), cond.value
    if value is None:
        return lambda facts: name in facts.headers
    return lambda facts: facts.headers.get(name) == value


@dataclass(frozen=True, slots=True)
class _CompiledDecision:
    decision: Decision
    matchers: tuple[_Matcher, ...]
    require_all: bool

    def matches(self, facts: RequestFacts) -> bool:
        if self.require_all:
            return all(m(facts) for m in self.matchers)
        return any(m(facts) for m in self.matchers)


def effective_decision(tl: TruthLensConfig, d: DecisionConfig | None) -> Decision:
    """Fill unset per-decision fields from the global settings."""
    grounded = tl.grounding.check_when_grounded
    if d is None:
        return Decision(None, tl.enabled, tl.default_mode, tl.thresholds.response, tl.default_action,
                        check_when_grounded=grounded, hold_back=tl.stream.hold_back,
                        upstream_logprobs=tl.signals.upstream_logprobs)
    p = d.plugins.truthlens
    return Decision(
        name=d.name,
        enabled=tl.enabled if p.enabled is None else p.enabled,
        mode=tl.default_mode if p.mode is None else p.mode,
        threshold=tl.thresholds.response if p.threshold is None else p.threshold,
        action=tl.default_action if p.action is None else p.action,
        signals=None if p.signals is None else frozenset(p.signals),
        check_when_grounded=grounded if p.check_when_grounded is None else p.check_when_grounded,
        hold_back=tl.stream.hold_back if p.hold_back is None else p.hold_back,
        upstream_logprobs=tl.signals.upstream_logprobs if p.upstream_logprobs is None else p.upstream_logprobs,
    )


class Policy:
    """Compiled decisions of one Config; immutable, safe to share across requests."""

    __slots__ = ("default", "uses_question", "has_decisions", "_decisions")

    def __init__(self, cfg: Config) -> None:
        ordered = sorted(cfg.decisions, key=lambda d: -d.priority)  # stable: ties keep file order
        self._decisions = tuple(
            _CompiledDecision(
                effective_decision(cfg.truthlens, d),
                tuple(_condition_matcher(c) for c in d.rules.conditions),
                d.rules.operator == "AND",
            )
            for d in ordered
        )
        self.has_decisions = bool(self._decisions)  # False: every request gets `default`, headers unread
        self.default = effective_decision(cfg.truthlens, None)
        # Keyword rules need the request body; without them a decision can be chosen from headers alone.
        self.uses_question = any(c.type == "keyword" for d in cfg.decisions for c in d.rules.conditions)

    def decide(self, headers: Mapping[str, str], question: str | None = None) -> Decision:
        """`select` straight from request headers; with no decisions configured, no facts are built."""
        if not self._decisions:
            return self.default
        return self.select(RequestFacts.from_headers(headers.items(), question))

    def select(self, facts: RequestFacts) -> Decision:
        for compiled in self._decisions:
            if compiled.matches(facts):
                return compiled.decision
        return self.default


_POLICIES: dict[int, tuple[Config, Policy]] = {}


def compile_policy(cfg: Config) -> Policy:
    """Cached by identity: hashing a whole Config per request would cost more than matching."""
    hit = _POLICIES.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    if len(_POLICIES) >= 8:  # configs are few (one per process, a handful in tests)
        _POLICIES.clear()
    policy = Policy(cfg)
    _POLICIES[id(cfg)] = (cfg, policy)
    return policy

