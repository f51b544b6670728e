"""The TruthLens configuration schema: one frozen dataclass per YAML mapping.

Attribute names are the YAML keys, so `cfg.truthlens.thresholds.token` reads
like the file. Defaults live here and nowhere else; `extproc.config` walks
these classes (type hints + field metadata) to validate a parsed YAML
mapping, so adding a key means adding one field.

Field metadata understood by the loader:
  min / max   inclusive numeric bounds
  check       callable(value) -> None | "what was expected" (syntax checks);
              for a list field it applies to each item
  nonempty    a sequence that must hold at least one item
  unique_names  a list of mappings whose `name` values must differ
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from extproc.config.values import (
    check_domain,
    check_grpc_target,
    check_header_name,
    check_host_port,
    check_http_url,
    check_listen_address,
    check_name,
    check_nonblank,
    check_regex,
    check_tag_name,
)

__all__ = [
    "Action",
    "BatchingConfig",
    "ConditionConfig",
    "ConditionType",
    "Config",
    "DecisionConfig",
    "ExplainerConfig",
    "GroundingConfig",
    "HoldBack",
    "InferenceConfig",
    "LightweightModeConfig",
    "LogLevel",
    "Mode",
    "ModelsConfig",
    "ModesConfig",
    "Operator",
    "PluginsConfig",
    "PremiumModeConfig",
    "Provider",
    "RulesConfig",
    "ScoreMethod",
    "ServerConfig",
    "StandardModeConfig",
    "StreamConfig",
    "TLSConfig",
    "TelemetryConfig",
    "ThresholdsConfig",
    "TracingConfig",
    "TruthLensConfig",
    "TruthLensPluginConfig",
    "VerifierConfig",
    "DEFAULT_WARNING_TEMPLATE",
]

Mode = Literal["lightweight", "standard", "premium"]
Action = Literal["header", "warn", "block", "none"]
Provider = Literal["auto", "cuda", "cpu"]
ScoreMethod = Literal["fused", "noisy_or", "max_span"]
Operator = Literal["AND", "OR"]
ConditionType = Literal["keyword", "domain", "header"]
LogLevel = Literal["debug", "info", "warning", "error"]
LoadBalancing = Literal["round_robin", "pick_first"]
HoldBack = Literal["none", "sentence"]
Signal = Literal["context_pmi", "latent_audit", "lens_emergence", "context_mmd"]  # the surrogate's white-box signals

DEFAULT_WARNING_TEMPLATE = (
    "\n\n[TruthLens] Parts of this answer may not be supported by the provided context "
    "(score {score:.2f}): {spans}"
)


def _bounded(default: Any, lo: float | None = None, hi: float | None = None) -> Any:
    return field(default=default, metadata={"min": lo, "max": hi})


def _unit(default: float) -> Any:
    """A probability threshold in [0, 1]."""
    return _bounded(default, 0.0, 1.0)


def _checked(default: Any, check: Callable[[Any], str | None]) -> Any:
    return field(default=default, metadata={"check": check})


def _sub(cls: type) -> Any:
    return field(default_factory=cls)


# --- server -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TLSConfig:
    enabled: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None  # set => clients must present a certificate (mTLS)

    @property
    def mtls(self) -> bool:
        return self.enabled and self.client_ca_file is not None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    grpc_address: str = _checked("127.0.0.1:50051", check_listen_address)
    metrics_address: str = _checked("127.0.0.1:9464", check_host_port)
    max_message_bytes: int = _bounded(16 * 1024 * 1024, 1024)
    shutdown_grace_s: float = _bounded(10.0, 0.0)
    # Envoy's ext_proc max_message_timeout (envoy/*.yaml, the chart's envoy.maxMessageTimeout): the most
    # standard/premium modes may ask for; a test keeps the Envoy configs and the chart equal to it.
    envoy_max_message_timeout_s: float = _bounded(60.0, 1.0)
    # gRPC streams one client connection may hold open at once (one per HTTP request in flight through
    # Envoy; its cluster allows the same 1024, envoy/*.yaml). Each idle stream costs ~22 kB: the cap bounds
    # what one connection can pin.
    max_concurrent_streams: int = _bounded(1024, 1)
    max_connection_idle_s: float = _bounded(300.0, 0.0)  # close a connection with no stream for this long (0: never)
    keepalive_time_s: float = _bounded(60.0, 1.0)  # ping a quiet connection this often...
    keepalive_timeout_s: float = _bounded(20.0, 1.0)  # ...and close it when the ping is not answered in time
    tls: TLSConfig = _sub(TLSConfig)


# --- truthlens (global plugin settings) ---------------------------------------


AUTO = "auto"
# `truthlens.models.detector: auto`: the 3-layer detector on CPUs (one 512-token window within 25 ms on 2 cores), all
# six layers where the models run on CUDA (2.7 ms a window there; better on the real-output suite, its card)
DETECTOR_TIERS = {"cpu": "models/detector", "cuda": "models/detector-full"}


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    provider: Provider = "auto"
    intra_op_threads: int = _bounded(0, 0)
    inter_op_threads: int = _bounded(1, 0)
    sentinel_prefilter: bool = True
    sentinel: str | None = "models/sentinel"
    detector: str | None = AUTO  # a model directory; auto = DETECTOR_TIERS: the quality tier when the models run on CUDA
    explainer: str | None = "models/explainer"
    surrogate: str | None = "models/surrogate"  # causal LM for the white-box signals (built by make setup-serve)

    @property
    def detector_dirs(self) -> tuple[str | None, str | None]:
        """(the detector directory, the one that replaces it when the models run on CUDA, or None)."""
        if self.detector == AUTO:
            return DETECTOR_TIERS["cpu"], DETECTOR_TIERS["cuda"]
        return self.detector, None


@dataclass(frozen=True, slots=True)
class ThresholdsConfig:
    sentinel: float = _unit(0.49)
    token: float = _unit(0.4)
    response: float = _unit(0.65)
    nli_entailment: float = _unit(0.9)
    min_span_tokens: int = _bounded(1, 1)
    min_span_chars: int = _bounded(2, 0)
    min_span_confidence: float = _unit(0.5)


@dataclass(frozen=True, slots=True)
class ExplainerConfig:
    enabled: bool = True
    drop_entailed: bool = True
    max_windows: int = _bounded(8, 0)  # per sentence: the context windows sharing most tokens with it; 0 = all


@dataclass(frozen=True, slots=True)
class SignalsConfig:
    context_pmi: bool = True  # the surrogate's context PMI joins the fused score (when the calibration has a fit)
    surrogate_max_tokens: int = _bounded(1024, 64)  # per surrogate pass: prompt + passages (head kept) + answer
    latent_audit: str | None = None  # `truthlens calibrate` file: the LatentAudit signal (needs a calibration fit)
    lens_emergence: bool = False  # LUMINA logit-lens signal (needs a calibration fit using it)
    context_mmd: bool = False  # LUMINA MMD vs other requests' passages (needs a calibration fit using it)
    reservoir_size: int = _bounded(64, 1)  # recent requests' passages kept in memory for context_mmd
    # ask the upstream for its token logprobs when the client did not (they are taken out of the response again);
    # reported per answer (x-truthlens-upstream-*), fused only through upstream_fusion
    upstream_logprobs: bool = False
    upstream_top_logprobs: int = _bounded(5, 0, 20)  # alternatives per token asked for (entropy needs >= 2)
    # `truthlens fit-upstream` file: per writer model, the response score stacked with that model's own logprob
    # signals (a response from a model it has no fit for keeps its score); null: logprobs are reported, not fused
    upstream_fusion: str | None = None


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    max_batch_tokens: int = _bounded(4096, 1)
    max_wait_ms: float = _bounded(2.0, 0.0)
    max_queue: int = _bounded(256, 1)
    # one answer's detection (detector + verifier rows, context windows included; ~1 s of CPU on 2 cores; each of
    # n choices has its own, max_queued_tokens bounds them together): past 8
    # characters per token of it the answer passes unchecked/too_large before tokenizing; rows over it read fewer
    # context windows (the best-matching ones, at least one per answer chunk and sentence), else too_large
    max_request_tokens: int = _bounded(16384, 512)
    max_queued_tokens: int = _bounded(65536, 512)  # per model, waiting to run; beyond it unchecked/overloaded


@dataclass(frozen=True, slots=True)
class InferenceConfig:
    """Where detection runs: local models (truthlens.models) or a remote detector pool (docs/detector-api.md)."""

    remote: tuple[str, ...] = _checked((), check_grpc_target)  # [] = local models; else the pool's endpoints
    deadline_ms: int = _bounded(4000, 1)  # one remote call, retries included
    retries: int = _bounded(1, 0)  # further attempts on another endpoint after an unavailable/overloaded one
    load_balancing: LoadBalancing = "round_robin"  # over the addresses one endpoint's name resolves to


@dataclass(frozen=True, slots=True)
class LightweightModeConfig:
    pass


@dataclass(frozen=True, slots=True)
class StandardModeConfig:
    max_iterations: int = _bounded(2, 1)
    # the LLM to re-ask; no default: a guessed address made a wrong one silent. Required when a decision
    # (or default_mode) uses standard; `truthlens dev` / `serve --upstream-url` fill it when null.
    upstream_url: str | None = _checked(None, check_http_url)
    timeout_ms: int = _bounded(20000, 1)  # 2 x (20 s + inference) + 5 s fits server.envoy_max_message_timeout_s


@dataclass(frozen=True, slots=True)
class VerifierConfig:
    name: str = field(metadata={"check": check_nonblank})
    base_url: str = field(metadata={"check": check_http_url})
    model: str = field(metadata={"check": check_nonblank})
    api_key_env: str | None = None  # name of the env var holding the key, never the key


@dataclass(frozen=True, slots=True)
class PremiumModeConfig:
    max_iterations: int = _bounded(1, 1)
    # at least one when a decision (or default_mode) uses premium
    verifiers: tuple[VerifierConfig, ...] = field(default=(), metadata={"unique_names": True})
    timeout_ms: int = _bounded(30000, 1)


@dataclass(frozen=True, slots=True)
class ModesConfig:
    lightweight: LightweightModeConfig = _sub(LightweightModeConfig)
    standard: StandardModeConfig = _sub(StandardModeConfig)
    premium: PremiumModeConfig = _sub(PremiumModeConfig)


@dataclass(frozen=True, slots=True)
class GroundingConfig:
    """Where grounding documents are found (extproc.protocol.grounding; docs/gateway.md#grounding)."""

    system_prompt: bool = True  # documents in system/developer messages (a document layout is required)
    user_sections: bool = True  # documents in user turns; the question is the text outside them
    tool_results: bool = True  # role tool / function messages
    context_field: bool = True  # the rag_context_field's documents (the field is removed upstream either way)
    section_labels: tuple[str, ...] = _checked(
        ("context", "documents", "document", "sources", "references", "passages", "passage",
         "search results", "retrieved context"), check_nonblank)
    question_labels: tuple[str, ...] = _checked(
        ("question", "query", "q", "user question", "user query", "task", "instructions", "instruction",
         "answer", "request"), check_nonblank)
    tags: tuple[str, ...] = _checked(
        ("context", "documents", "document", "sources", "source", "passages", "passage", "references",
         "reference", "search_results", "search_result"), check_tag_name)
    patterns: tuple[str, ...] = _checked((), check_regex)  # regexes; the document is group `doc` (else 1, else all)
    check_when_grounded: bool = True  # a request with documents is checked whatever the sentinel says


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Streamed (SSE) answers: judged sentence by sentence while they arrive."""

    # none: every chunk goes on at once, the verdict closes the stream; sentence: a chunk goes on once the
    # sentences it carries are checked (with action block, a flagged sentence ends the stream instead)
    hold_back: HoldBack = "none"
    # a sentence still open after this many characters is checked as it is (bounds the hold and Envoy's wait)
    max_hold_chars: int = _bounded(600, 20)


@dataclass(frozen=True, slots=True)
class TruthLensConfig:
    enabled: bool = True
    default_mode: Mode = "lightweight"
    default_action: Action = "header"
    score_method: ScoreMethod = "fused"
    warning_template: str = DEFAULT_WARNING_TEMPLATE  # checked by extproc.config
    block_status: int = _bounded(422, 400, 599)
    max_body_bytes: int = _bounded(4 * 1024 * 1024, 1)
    inference_timeout_ms: int = _bounded(5000, 1)
    rag_context_field: str | None = "truthlens_context"
    sentinel_include_system_prompt: bool = False
    grounding: GroundingConfig = _sub(GroundingConfig)
    stream: StreamConfig = _sub(StreamConfig)
    models: ModelsConfig = _sub(ModelsConfig)
    thresholds: ThresholdsConfig = _sub(ThresholdsConfig)
    explainer: ExplainerConfig = _sub(ExplainerConfig)
    signals: SignalsConfig = _sub(SignalsConfig)
    batching: BatchingConfig = _sub(BatchingConfig)
    inference: InferenceConfig = _sub(InferenceConfig)
    modes: ModesConfig = _sub(ModesConfig)


# --- telemetry ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TracingConfig:
    enabled: bool = False
    otlp_endpoint: str = _checked("http://127.0.0.1:4317", check_http_url)
    service_name: str = _checked("truthlens", check_nonblank)


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    log_level: LogLevel = "info"
    log_content: bool = False
    tracing: TracingConfig = _sub(TracingConfig)


# --- decisions ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConditionConfig:
    """One rule condition; which of the optional fields apply depends on `type`."""

    type: ConditionType
    # type=keyword: any of them, whole words, case-insensitive
    keywords: tuple[str, ...] = _checked((), check_nonblank)
    # type=domain: the request host equals one of them or is a subdomain of it
    domains: tuple[str, ...] = _checked((), check_domain)
    name: str | None = _checked(None, check_header_name)  # type=header, case-insensitive
    value: str | None = None  # type=header: exact value; null = header present


@dataclass(frozen=True, slots=True)
class RulesConfig:
    operator: Operator = "OR"
    conditions: tuple[ConditionConfig, ...] = field(default=(), metadata={"nonempty": True})


@dataclass(frozen=True, slots=True)
class TruthLensPluginConfig:
    """Per-decision overrides; null means "inherit the global truthlens setting"."""

    enabled: bool | None = None
    mode: Mode | None = None
    threshold: float | None = _unit(None)  # overrides thresholds.response
    action: Action | None = None
    # the white-box signals this route may use (of those on under truthlens.signals); [] = none, no surrogate pass
    signals: tuple[Signal, ...] | None = None
    check_when_grounded: bool | None = None  # overrides truthlens.grounding.check_when_grounded
    hold_back: HoldBack | None = None  # overrides truthlens.stream.hold_back
    upstream_logprobs: bool | None = None  # overrides truthlens.signals.upstream_logprobs


@dataclass(frozen=True, slots=True)
class PluginsConfig:
    truthlens: TruthLensPluginConfig = _sub(TruthLensPluginConfig)


@dataclass(frozen=True, slots=True)
class DecisionConfig:
    name: str = field(metadata={"check": check_name})
    rules: RulesConfig = field()
    priority: int = 0
    plugins: PluginsConfig = _sub(PluginsConfig)


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = _sub(ServerConfig)
    truthlens: TruthLensConfig = _sub(TruthLensConfig)
    telemetry: TelemetryConfig = _sub(TelemetryConfig)
    decisions: tuple[DecisionConfig, ...] = field(default=(), metadata={"unique_names": True})


# Per condition type: the keys it accepts besides `type`, and which are required.
CONDITION_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "keyword": (frozenset({"keywords"}), frozenset({"keywords"})),
    "domain": (frozenset({"domains"}), frozenset({"domains"})),
    "header": (frozenset({"name", "value"}), frozenset({"name"})),
}
