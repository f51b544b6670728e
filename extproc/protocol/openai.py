"""OpenAI chat-completions bodies: what the firewall needs out of them, and the few edits it makes.

Public API (pure functions over bytes; no config import, no model code):

- ``parse_chat_request(body, rag_field="truthlens_context", grounding=None) -> ChatRequest`` (``None``: no RAG field)
- ``parse_chat_response(body) -> ChatResponse``
- ``append_to_choices(body, text) -> bytes``
- ``error_body(message, *, type="truthlens_error", code=None, extra=None) -> bytes``
- ``content_text(content) -> tuple[str, int]``
- ``read_json(data)``: ``json.loads`` semantics, read by orjson where the two agree
- ``ProtocolError``: every malformed-input case; the message says what was wrong and where.

Grounding rules (issues 2, 17): in conversation order, the documents of system prompts and user
turns (found by ``grounding``, extproc.protocol.grounding: labelled sections, tags, numbered
sources, fenced blocks, user patterns) and every ``role: tool`` (and legacy ``role: function``)
message, one passage each, followed by the caller's RAG documents from the ``rag_field``
extension field; each source can be switched off. Earlier assistant turns are never grounding.
The question is the last user turn's text outside its documents. That field is not an OpenAI parameter, so it is removed before
the request goes upstream (``ChatRequest.upstream_body``). Declared tools without any tool
result give no grounding: the context tuple is simply empty.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.protocol.grounding import GroundingRules

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "ProtocolError",
    "RagFieldError",
    "append_to_choices",
    "content_text",
    "dump_json",
    "error_body",
    "parse_chat_request",
    "parse_chat_response",
    "may_hold_surrogates",
    "read_json",
    "scrub_surrogates",
]

_SYSTEM_ROLES = frozenset({"system", "developer"})
_TOOL_RESULT_ROLES = frozenset({"tool", "function"})
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


class ProtocolError(ValueError):
    """The body is not the chat-completions JSON we can judge; the gateway passes it through.

    `upstream_body`: for a request whose RAG field was removed before the error was found, the body
    without it (forward that, never the original). `object_read`: the body was a JSON object (so
    the RAG field's presence is known exactly).
    """

    upstream_body: bytes | None = None
    object_read: bool = False


class RagFieldError(ProtocolError):
    """The RAG field is present but not a string, a list of strings or a list of documents.

    The gateway refuses such a request (400, `param` = the field) rather than guess what was meant.
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(slots=True)  # read-only by convention; frozen construction would cost ~2 us per request
class ChatRequest:
    model: str | None
    stream: bool
    question: str | None  # the last user message's text outside its documents; None when there is none
    system_prompt: str | None  # system + developer messages (outside their documents) joined by a blank line
    context: tuple[str, ...]  # documents of system prompts, user turns, tool results in order, then RAG documents
    has_tools: bool  # `tools` or legacy `functions` declared
    has_tool_results: bool
    messages_count: int
    upstream_body: bytes | None  # body without the RAG field; None = forward the original bytes
    non_text_parts: int = 0  # image/audio/file parts seen (ignored for judging, still counted)
    rag_documents: int = 0  # how many passages came from the RAG field
    text_documents: int = 0  # how many came from system prompts and user turns (extproc.protocol.grounding)

    @property
    def grounded(self) -> bool:
        """True when there is any context to judge the answer against."""
        return bool(self.context)


@dataclass(frozen=True, slots=True)
class ChatResponse:
    id: str | None
    model: str | None
    answers: tuple[str | None, ...]  # one per choice in `index` order; None = no text (tool calls only)
    finish_reasons: tuple[str | None, ...] = ()


def dump_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON: what we send when a body must be re-serialized.

    A lone surrogate (a `\\ud800` escape the sender wrote, which json.loads keeps) has no UTF-8
    form: such an object is written with ASCII escapes instead, so it goes out as it came in.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")


# A JSON escape of a surrogate code point, or a surrogate's raw 3-byte form (invalid UTF-8, but
# json.loads decodes bytes with "surrogatepass"): only bodies holding one can carry a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD, one for one (offsets stay valid).

    Text that reaches tokenizers, models, headers and gRPC must be valid Unicode; json.loads keeps
    an escaped lone surrogate (`"\\ud800"`) as is, and a paired one is already one character.
    """
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def may_hold_surrogates(data: bytes | str) -> bool:
    """True when text parsed from `data` may hold a lone surrogate: a `\\uD8xx`-style escape, or a
    body json.loads reads as UTF-16/32 or after a BOM (cheap scans of the raw bytes)."""
    if isinstance(data, str):
        return "\\u" in data or _SURROGATE.search(data) is not None
    return (_SURROGATE_ESCAPE.search(data) is not None or b"\x00" in data[:4]
            or data[:3] == codecs.BOM_UTF8 or data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))


def read_json(data: bytes | str) -> Any:
    """`json.loads`, read by orjson wherever the two agree.

    orjson reads strict RFC 8259 JSON (almost every body) several times faster; whatever it rejects
    (NaN, lone surrogates, a BOM, UTF-16, deep nesting, ...) goes to json.loads, which has the last
    word and raises its own errors. orjson turns integers beyond 64 bits into floats: for an object
    that will be re-serialized, use `_stdlib_loads`.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _stdlib_loads(data)


def _stdlib_loads(data: bytes | str) -> Any:
    if isinstance(data, bytes) and not data.startswith(codecs.BOM_UTF8):
        # JSON on the wire is UTF-8 (RFC 8259): decoding it directly skips json's encoding
        # sniffing; a BOM or another UTF still goes through json.loads' detection.
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return json.loads(data)


def _load_object(body: bytes, what: str, *, exact: bool = False) -> dict[str, Any]:
    """The body's JSON object (`exact`: json.loads only, for an object that is re-serialized)."""
    try:
        obj = _stdlib_loads(body) if exact else read_json(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"{what} is nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def content_text(content: Any, where: str = "content") -> tuple[str, int]:
    """Text of a message `content` (string, null, or list of parts) and the count of non-text parts.

    Text parts are joined with "\\n" so passages keep a visible boundary.
    """
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        raise ProtocolError(f"{where} must be a string, null or a list of parts, got {type(content).__name__}")
    texts: list[str] = []
    other = 0
    for i, part in enumerate(content):
        if isinstance(part, str):  # not in the spec, but some clients send bare strings
            texts.append(part)
        elif isinstance(part, dict):
            if part.get("type") in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
            else:
                other += 1
        else:
            raise ProtocolError(f"{where}[{i}] must be an object, got {type(part).__name__}")
    return "\n".join(texts), other


def _rag_passages(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if not isinstance(value, list):
        raise RagFieldError(f"{field} must be a string or a list, got {type(value).__name__}", field)
    out: list[str] = []
    for i, doc in enumerate(value):
        if isinstance(doc, str):
            text = doc
        elif isinstance(doc, dict):
            raw = doc.get("text", doc.get("content"))
            if raw is None:
                raise RagFieldError(f"{field}[{i}] needs a 'text' or 'content' key", field)
            try:
                text, _ = content_text(raw, f"{field}[{i}].content")
            except ProtocolError as exc:
                raise RagFieldError(str(exc), field) from None
        else:
            raise RagFieldError(f"{field}[{i}] must be a string or an object, got {type(doc).__name__}", field)
        if text.strip():
            out.append(text)
    return out


def parse_chat_request(body: bytes, rag_field: str | None = "truthlens_context",
                       grounding: GroundingRules | None = None) -> ChatRequest:
    """Extract question, system prompt and grounding passages from a chat-completions request.

    `rag_field=None` turns the RAG convention off: the body is never rewritten. `grounding`: where
    documents are looked for (extproc.protocol.grounding); None = tool results and the RAG field only.
    """
    # The RAG field is removed by re-serializing the object: then it must be read exactly.
    exact = rag_field is not None and rag_field.encode() in body
    obj = _load_object(body, "request body", exact=exact)
    upstream_body: bytes | None = None
    rag_value: Any = None
    if rag_field is not None and rag_field in obj:
        # Removed first, so that a request we cannot judge still never carries it upstream.
        rag_value = obj.pop(rag_field)
        upstream_body = dump_json(obj)
    try:
        rag = _rag_passages(rag_value, rag_field) if rag_field is not None else []
        chat = _chat_request(obj, rag, grounding)
    except ProtocolError as exc:
        exc.object_read, exc.upstream_body = True, upstream_body
        raise
    chat.upstream_body = upstream_body
    if may_hold_surrogates(body):  # an escaped lone surrogate must not reach tokenizers or headers
        chat.question = scrub_surrogates(chat.question) if chat.question is not None else None
        chat.system_prompt = scrub_surrogates(chat.system_prompt) if chat.system_prompt is not None else None
        chat.context = tuple(map(scrub_surrogates, chat.context))
    return chat


def _chat_request(obj: dict[str, Any], rag: list[str], grounding: GroundingRules | None = None) -> ChatRequest:
    """The request's parts (the RAG field already removed from `obj` and read into `rag`)."""
    g = grounding.settings if grounding is not None else None
    if g is not None and not g.context_field:
        rag = []
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("request body needs a non-empty 'messages' list")

    question: str | None = None
    system: list[str] = []
    passages: list[str] = []  # conversation order: system prompt documents, user-turn documents, tool results
    found = 0  # documents found in message text (system prompts, user turns)
    tool_results = 0
    non_text = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ProtocolError(f"messages[{i}] must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str):
            raise ProtocolError(f"messages[{i}].role must be a string")
        content = msg.get("content")
        if isinstance(content, str):  # the common case: no parts to walk
            text = content
        else:
            text, other = content_text(content, f"messages[{i}].content")
            non_text += other
        if role == "user":
            if g is not None and g.user_sections:
                docs, text = grounding.split(text)  # type: ignore[union-attr]
                passages += docs
                found += len(docs)
            question = text if text.strip() else None
        elif role in _SYSTEM_ROLES:
            if g is not None and g.system_prompt:
                docs, text = grounding.split(text, question=False)  # type: ignore[union-attr]
                passages += docs
                found += len(docs)
            if text.strip():
                system.append(text)
        elif role in _TOOL_RESULT_ROLES:
            tool_results += 1
            if text.strip() and (g is None or g.tool_results):
                passages.append(text)

    tools = obj.get("tools") or obj.get("functions")
    model = obj.get("model")
    return ChatRequest(
        model=model if isinstance(model, str) else None,
        stream=obj.get("stream") is True,
        question=question,
        system_prompt="\n\n".join(system) if system else None,
        context=tuple(passages + rag),
        has_tools=isinstance(tools, list) and len(tools) > 0,
        has_tool_results=tool_results > 0,
        messages_count=len(messages),
        upstream_body=None,
        non_text_parts=non_text,
        rag_documents=len(rag),
        text_documents=found,
    )


def _choices(obj: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """Choices sorted by `index` (position when absent), each with its message object."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        if "error" in obj:
            raise ProtocolError("response body is an error object, not a chat completion")
        raise ProtocolError("response body needs a 'choices' list")
    out: list[tuple[int, dict[str, Any]]] = []
    for pos, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise ProtocolError(f"choices[{pos}] must be an object")
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ProtocolError(f"choices[{pos}].message must be an object")
        index = choice.get("index", pos)
        if not isinstance(index, int) or isinstance(index, bool):
            raise ProtocolError(f"choices[{pos}].index must be an integer")
        out.append((index, choice))
    out.sort(key=lambda item: item[0])
    return out


def parse_chat_response(body: bytes) -> ChatResponse:
    """Every choice's answer text, in `index` order."""
    obj = _load_object(body, "response body")
    answers: list[str | None] = []
    reasons: list[str | None] = []
    for index, choice in _choices(obj):
        content = choice["message"].get("content")
        if content is None:
            answers.append(None)
        else:
            text, _ = content_text(content, f"choices[{index}].message.content")
            answers.append(text)
        reason = choice.get("finish_reason")
        reasons.append(reason if isinstance(reason, str) else None)
    rid, model = obj.get("id"), obj.get("model")
    rid, model = (rid if isinstance(rid, str) else None), (model if isinstance(model, str) else None)
    if may_hold_surrogates(body):  # an escaped lone surrogate must not reach tokenizers or headers
        answers = [scrub_surrogates(a) if a is not None else None for a in answers]
        rid = scrub_surrogates(rid) if rid is not None else None
        model = scrub_surrogates(model) if model is not None else None
    return ChatResponse(
        id=rid,
        model=model,
        answers=tuple(answers),
        finish_reasons=tuple(reasons),
    )


def append_to_choices(body: bytes, text: str | Mapping[int, str]) -> bytes:
    """Append `text` to every choice's message content (or, given a mapping, to those indices only).

    Choices without content (tool calls only) are left alone; list-form content gets one more
    text part. Every other field survives; the body is re-serialized as compact JSON, so the
    caller must recompute content-length (the envoy builders do).
    """
    obj = _load_object(body, "response body", exact=True)  # re-serialized below
    for index, choice in _choices(obj):
        extra = text.get(index) if isinstance(text, Mapping) else text
        if not extra:
            continue
        message = choice["message"]
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = content + extra
        elif isinstance(content, list):
            content.append({"type": "text", "text": extra})
    return dump_json(obj)


def error_body(
    message: str,
    *,
    type: str = "truthlens_error",  # noqa: A002 - the OpenAI field is called `type`
    code: str | None = None,
    extra: Mapping[str, Any] | None = None,
    param: str | None = None,
) -> bytes:
    """An OpenAI-style error object, so SDK clients raise a readable APIError."""
    obj: dict[str, Any] = {"error": {"message": message, "type": type, "param": param, "code": code}}
    if extra is not None:
        obj["truthlens"] = dict(extra)
    return dump_json(obj)
