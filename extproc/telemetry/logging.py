"""structlog JSON logs on stderr, one object per line, tagged with the request id.

Prompts, answers and grounding documents are user data: unless
`log_content` is switched on, the redaction processor replaces any value
logged under a content key (at any nesting depth) with its length, so a
careless `log.info("...", body=body)` cannot leak text.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar, Token
from typing import Any, Mapping, MutableMapping, TextIO

import structlog
import structlog.tracebacks

CONTENT_KEYS = frozenset(
    {
        "prompt",
        "question",
        "answer",
        "context",
        "contexts",
        "body",
        "content",
        "messages",
        "text",
        "completion",
        "documents",
        "warning_text",
    }
)
_HANDLER_MARK = "_truthlens_handler"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def redact(value: Any) -> str:
    """Keep the size (useful when debugging) and drop the text."""
    if isinstance(value, str):
        return f"[redacted {len(value)} chars]"
    if isinstance(value, bytes | bytearray):
        return f"[redacted {len(value)} bytes]"
    if isinstance(value, Mapping | list | tuple):
        return f"[redacted {len(value)} items]"
    return "[redacted]"


class ContentRedactor:
    """structlog processor: content keys are replaced unless log_content is on."""

    def __init__(self, log_content: bool, keys: frozenset[str] = CONTENT_KEYS) -> None:
        self.log_content = log_content
        self.keys = keys

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if self.log_content:
            return event_dict
        for key, value in event_dict.items():
            if key in self.keys:
                event_dict[key] = redact(value)
            elif isinstance(value, Mapping | list | tuple):
                event_dict[key] = self._scrub(value)
        return event_dict

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: redact(v) if k in self.keys else self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(v) for v in value]
        return value


def configure_logging(level: str = "info", log_content: bool = False, stream: TextIO | None = None) -> None:
    """Process-wide setup, once at startup (tests pass a StringIO).

    structlog loggers and plain `logging.getLogger(...)` records both end in
    one stdlib handler rendering JSON, so library and gateway code that logs
    the stdlib way still gets the request id, the redaction and one format.
    """
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        add_request_id,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.ExtraAdder(),  # stdlib `extra={...}` fields become JSON keys (and get redacted)
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        ContentRedactor(log_content),
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.stdlib.PositionalArgumentsFormatter(),
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=stream is None,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # Tracebacks without local variables: locals would hold prompts and answers.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=log_content)
            ),
            structlog.processors.JSONRenderer(default=repr),
        ],
    )
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    _remove_our_handlers(root)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])


def reset_logging() -> None:
    """Undo configure_logging (tests): remove our handler, structlog back to its defaults."""
    _remove_our_handlers(logging.getLogger())
    structlog.reset_defaults()


def _remove_our_handlers(root: logging.Logger) -> None:
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)


def get_logger(name: str = "truthlens", **initial: Any) -> Any:
    return structlog.get_logger(name, **initial)


# The current ext_proc stream's request id: a str, or an object with a `request_id` attribute
# (the RequestContext) read only when a line is actually logged. Most requests log nothing, and
# their id would otherwise have to be read from the request headers up front.
_REQUEST: ContextVar[Any] = ContextVar("truthlens_request", default=None)


def add_request_id(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the bound request's id on every line of its task."""
    source = _REQUEST.get()
    if source is not None and "request_id" not in event_dict:
        event_dict["request_id"] = source if isinstance(source, str) else source.request_id
    return event_dict


def bind_request(source: Any) -> Token[Any]:
    """Tag every log line of the current task (one ext_proc stream); `source`: an id or an object with `request_id`."""
    return _REQUEST.set(source)


def unbind_request(token: Token[Any]) -> None:
    _REQUEST.reset(token)

