from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SignalSet(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class DetectRequest(_message.Message):
    __slots__ = ("context", "question", "answer", "signals")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    context: _containers.RepeatedScalarFieldContainer[str]
    question: str
    answer: str
    signals: SignalSet
    def __init__(self, context: _Optional[_Iterable[str]] = ..., question: _Optional[str] = ..., answer: _Optional[str] = ..., signals: _Optional[_Union[SignalSet, _Mapping]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end", "text", "score", "tokens", "nli_label", "nli_confidence", "severity")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NLI_LABEL_FIELD_NUMBER: _ClassVar[int]
    NLI_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    text: str
    score: float
    tokens: int
    nli_label: str
    nli_confidence: float
    severity: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., tokens: _Optional[int] = ..., nli_label: _Optional[str] = ..., nli_confidence: _Optional[float] = ..., severity: _Optional[int] = ...) -> None: ...

class DetectResponse(_message.Message):
    __slots__ = ("score", "spans", "windows", "dropped_spans", "latency_ms", "timings_ms", "signals")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SPANS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    score: float
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    windows: int
    dropped_spans: int
    latency_ms: float
    timings_ms: _containers.ScalarMap[str, float]
    signals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, score: _Optional[float] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., windows: _Optional[int] = ..., dropped_spans: _Optional[int] = ..., latency_ms: _Optional[float] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., signals: _Optional[_Iterable[str]] = ...) -> None: ...

class ClassifyPromptRequest(_message.Message):
    __slots__ = ("prompt", "skip_prefilter")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SKIP_PREFILTER_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    skip_prefilter: bool
    def __init__(self, prompt: _Optional[str] = ..., skip_prefilter: _Optional[bool] = ...) -> None: ...

class ClassifyPromptResponse(_message.Message):
    __slots__ = ("needs_check", "confidence", "latency_ms", "decided_by")
    NEEDS_CHECK_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    needs_check: bool
    confidence: float
    latency_ms: float
    decided_by: str
    def __init__(self, needs_check: _Optional[bool] = ..., confidence: _Optional[float] = ..., latency_ms: _Optional[float] = ..., decided_by: _Optional[str] = ...) -> None: ...

class TextRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("context", "answer", "ranges")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    context: _containers.RepeatedScalarFieldContainer[str]
    answer: str
    ranges: _containers.RepeatedCompositeFieldContainer[TextRange]
    def __init__(self, context: _Optional[_Iterable[str]] = ..., answer: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[TextRange, _Mapping]]] = ...) -> None: ...

class Claim(_message.Message):
    __slots__ = ("start", "end", "sentence", "label", "confidence", "entailment")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ENTAILMENT_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    sentence: str
    label: str
    confidence: float
    entailment: float
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., sentence: _Optional[str] = ..., label: _Optional[str] = ..., confidence: _Optional[float] = ..., entailment: _Optional[float] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("claims", "latency_ms")
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    claims: _containers.RepeatedCompositeFieldContainer[Claim]
    latency_ms: float
    def __init__(self, claims: _Optional[_Iterable[_Union[Claim, _Mapping]]] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("role", "name", "provider")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    role: str
    name: str
    provider: str
    def __init__(self, role: _Optional[str] = ..., name: _Optional[str] = ..., provider: _Optional[str] = ...) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("version", "models", "signals")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    version: str
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    signals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., signals: _Optional[_Iterable[str]] = ...) -> None: ...
