"""Envoy ext_proc messages (xds-protos generated stubs): header reading and response builders.

Public API (all return ``ProcessingResponse`` unless said otherwise):

- ``request_headers_response(set_headers=(), remove_headers=(), mode_override=None)``
- ``request_body_response(body, set_headers=(), remove_headers=())``
- ``response_headers_response(set_headers=(), remove_headers=(), mode_override=None)``
- ``response_body_response(body, set_headers=(), remove_headers=())``  (BUFFERED bodies)
- ``streamed_chunk_response(body)``  (STREAMED chunks; ``None`` = chunk unchanged)
- ``immediate_response(status, headers=(), body=b"", details="")``
- ``timeout_extension_response(seconds)``  (asks Envoy for more time on the current message)
- ``headers_dict(headers) -> dict[str, str]``, ``header_text(header) -> str``,
  ``truthlens_header_names(headers) -> tuple[str, ...]``
- Modes: ``processing_mode(...)``, ``STREAMED_RESPONSE_MODE``, ``SKIP_REST_MODE``.

``set_headers`` is a mapping or an iterable of ``(name, value)`` pairs (value ``str`` or
``bytes``); every header goes out as ``raw_value`` with ``OVERWRITE_IF_EXISTS_OR_ADD``:
Envoy 1.40 (runtime ``send_header_raw_value``, on by default) reads only ``raw_value`` and
rejects a HeaderValue carrying both fields.

content-length: Envoy keeps the original header in BUFFERED mode and, in the same body
response, applies header mutations before it checks the header against the new body; a
mismatch turns into a local 500 with an empty body. So a body replacement sets
``content-length`` to the new length in that same message. Removing it also passes the check,
but turns the response into chunked framing for no reason. (Checked against Envoy 1.40: stale
length -> 500; removed -> 200 chunked; set -> 200 with the new length. See
docs/protobuf-choice.md.) When the response body switches to STREAMED, chunk edits change the
length, so ``content-length`` is removed in the response-headers message.

Calls that change nothing return shared, precomputed messages: never mutate a returned message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Union

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

__all__ = [
    "ProcessingMode",
    "ProcessingRequest",
    "ProcessingResponse",
    "SKIP_REST_MODE",
    "STREAMED_RESPONSE_MODE",
    "TRUTHLENS_HEADER_PREFIX",
    "header_text",
    "headers_dict",
    "immediate_response",
    "processing_mode",
    "request_body_response",
    "request_headers_response",
    "response_body_response",
    "response_headers_response",
    "streamed_chunk_response",
    "timeout_extension_response",
    "truthlens_header_names",
]

ProcessingRequest = ep.ProcessingRequest
ProcessingResponse = ep.ProcessingResponse
ProcessingMode = processing_mode_pb2.ProcessingMode

HeaderInput = Union[Mapping[str, Union[str, bytes]], Iterable[tuple[str, Union[str, bytes]]]]

TRUTHLENS_HEADER_PREFIX = "x-truthlens-"
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_CONTENT_LENGTH = "content-length"


def processing_mode(
    *,
    request_headers: int = ProcessingMode.SEND,
    response_headers: int = ProcessingMode.SEND,
    request_body: int = ProcessingMode.BUFFERED,
    response_body: int = ProcessingMode.BUFFERED,
    request_trailers: int = ProcessingMode.SKIP,
    response_trailers: int = ProcessingMode.SKIP,
) -> ProcessingMode:
    """A full ProcessingMode: an override replaces every field, so all of them are spelled out."""
    return ProcessingMode(
        request_header_mode=request_headers,
        response_header_mode=response_headers,
        request_body_mode=request_body,
        response_body_mode=response_body,
        request_trailer_mode=request_trailers,
        response_trailer_mode=response_trailers,
    )


# Sent with the response-headers reply of an SSE response: chunks reach us as they arrive.
# If Envoy's `allowed_override_modes` is configured, it must list exactly this mode.
STREAMED_RESPONSE_MODE = processing_mode(response_body=ProcessingMode.STREAMED)
# Sent with the request-headers reply when nothing else in this stream needs us.
SKIP_REST_MODE = processing_mode(
    response_headers=ProcessingMode.SKIP,
    request_body=ProcessingMode.NONE,
    response_body=ProcessingMode.NONE,
)


def header_text(header: base_pb2.HeaderValue) -> str:
    """A header's value as text: Envoy 1.40 fills `raw_value`, older ones `value`."""
    raw = header.raw_value
    return raw.decode("utf-8", "replace") if raw else header.value


def headers_dict(headers: ep.HttpHeaders | base_pb2.HeaderMap) -> dict[str, str]:
    """Lower-case name -> value; repeated headers joined with ", " (RFC 9110 list semantics).

    Walk the headers once with this and pass the dict to `truthlens_header_names`: every
    access to the repeated protobuf field builds wrapper objects, which costs more than the dict.
    """
    header_map = headers.headers if isinstance(headers, ep.HttpHeaders) else headers
    entries = header_map.headers
    out = {h.key.lower(): h.raw_value.decode("utf-8", "replace") or h.value for h in entries}
    if len(out) == len(entries):
        return out
    out = {}  # a name repeats: join its values in order
    for header in entries:
        key = header.key.lower()
        value = header_text(header)
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


_PREFIX_BYTES = TRUTHLENS_HEADER_PREFIX.encode()


def truthlens_header_names(headers: ep.HttpHeaders | Mapping[str, str] | Iterable[str]) -> tuple[str, ...]:
    """Names of x-truthlens-* headers (lower-case, once each), to remove before they can spoof a verdict.

    Takes the proto, the dict from `headers_dict` or any iterable of names. Almost no message
    carries one: a single substring search says so before any per-name work (on the proto, over
    its serialized bytes: reading each entry would build a Python object per header).
    """
    if isinstance(headers, ep.HttpHeaders):
        if _PREFIX_BYTES not in headers.headers.SerializeToString().lower():
            return ()
        names = [h.key for h in headers.headers.headers]
    else:
        names = list(headers)
    prefix = TRUTHLENS_HEADER_PREFIX
    if prefix not in "\n".join(names).lower():
        return ()
    return tuple(dict.fromkeys(low for low in map(str.lower, names) if low.startswith(prefix)))


def _pairs(headers: HeaderInput) -> Iterable[tuple[str, str | bytes]]:
    if isinstance(headers, (dict, list, tuple)):  # the common cases, without an ABC check
        return headers.items() if isinstance(headers, dict) else headers
    return headers.items() if isinstance(headers, Mapping) else headers


def _fill(mutation: ep.HeaderMutation, set_headers: HeaderInput, remove_headers: Iterable[str]) -> None:
    for key, value in _pairs(set_headers):
        option = mutation.set_headers.add()
        option.header.key = key
        option.header.raw_value = value if isinstance(value, bytes) else value.encode("utf-8")
        option.append_action = _OVERWRITE
    mutation.remove_headers.extend(remove_headers)


def _common(
    common: ep.CommonResponse,
    set_headers: HeaderInput,
    remove_headers: Iterable[str],
    body: bytes | None,
) -> None:
    if body is not None:
        set_list = [(k, v) for k, v in _pairs(set_headers) if k.lower() != _CONTENT_LENGTH]
        set_list.append((_CONTENT_LENGTH, str(len(body))))
        set_headers = set_list
        remove_headers = [h for h in remove_headers if h.lower() != _CONTENT_LENGTH]
        common.body_mutation.body = body
    _fill(common.header_mutation, set_headers, remove_headers)


def _headers_reply(
    arm: str, set_headers: HeaderInput, remove_headers: Iterable[str], mode: ProcessingMode | None
) -> ProcessingResponse:
    response = ProcessingResponse()
    _common(getattr(response, arm).response, set_headers, remove_headers, None)
    if mode is not None:
        response.mode_override.CopyFrom(mode)
    return response


def _body_reply(
    arm: str, body: bytes | None, set_headers: HeaderInput, remove_headers: Iterable[str]
) -> ProcessingResponse:
    response = ProcessingResponse()
    _common(getattr(response, arm).response, set_headers, remove_headers, body)
    return response


def _empty(arm: str) -> ProcessingResponse:
    response = ProcessingResponse()
    getattr(response, arm).SetInParent()
    return response


_CONTINUE = {arm: _empty(arm) for arm in ("request_headers", "request_body", "response_headers", "response_body")}


def request_headers_response(
    set_headers: HeaderInput = (),
    remove_headers: Iterable[str] = (),
    mode_override: ProcessingMode | None = None,
) -> ProcessingResponse:
    """Reply to request_headers; e.g. set accept-encoding: identity, remove x-truthlens-*."""
    if not set_headers and not remove_headers and mode_override is None:
        return _CONTINUE["request_headers"]
    return _headers_reply("request_headers", set_headers, remove_headers, mode_override)


def request_body_response(
    body: bytes | None, set_headers: HeaderInput = (), remove_headers: Iterable[str] = ()
) -> ProcessingResponse:
    """Reply to a BUFFERED request body; a new body comes with its content-length."""
    if body is None and not set_headers and not remove_headers:
        return _CONTINUE["request_body"]
    return _body_reply("request_body", body, set_headers, remove_headers)


def response_headers_response(
    set_headers: HeaderInput = (),
    remove_headers: Iterable[str] = (),
    mode_override: ProcessingMode | None = None,
) -> ProcessingResponse:
    """Reply to response_headers; a STREAMED (or partial) body override also drops content-length."""
    if mode_override is not None and mode_override.response_body_mode not in (
        ProcessingMode.BUFFERED,
        ProcessingMode.NONE,
    ):
        remove_headers = [*remove_headers, _CONTENT_LENGTH]
        set_headers = [(k, v) for k, v in _pairs(set_headers) if k.lower() != _CONTENT_LENGTH]
    if not set_headers and not remove_headers and mode_override is None:
        return _CONTINUE["response_headers"]
    return _headers_reply("response_headers", set_headers, remove_headers, mode_override)


def response_body_response(
    body: bytes | None, set_headers: HeaderInput = (), remove_headers: Iterable[str] = ()
) -> ProcessingResponse:
    """Reply to a BUFFERED response body (headers are still held, so verdict headers go here)."""
    if body is None and not set_headers and not remove_headers:
        return _CONTINUE["response_body"]
    return _body_reply("response_body", body, set_headers, remove_headers)


def streamed_chunk_response(body: bytes | None) -> ProcessingResponse:
    """Reply to one STREAMED response chunk: None forwards it as is, bytes replace it (b"" drops it)."""
    if body is None:
        return _CONTINUE["response_body"]
    response = ProcessingResponse()
    response.response_body.response.body_mutation.body = body
    return response


def immediate_response(
    status: int,
    headers: HeaderInput = (),
    body: bytes = b"",
    details: str = "",
) -> ProcessingResponse:
    """Answer the client now (block, overload); Envoy computes content-length for local replies."""
    response = ProcessingResponse()
    immediate = response.immediate_response
    immediate.status.code = status  # proto3 enum: open, any 3-digit code is accepted
    _fill(immediate.headers, headers, ())
    immediate.body = body
    if details:
        immediate.details = details
    return response


def timeout_extension_response(seconds: float) -> ProcessingResponse:
    """Ask Envoy to wait longer for this message (needs max_message_timeout in the filter config)."""
    response = ProcessingResponse()
    nanos = int(round(seconds * 1e9))
    response.override_message_timeout.seconds, response.override_message_timeout.nanos = divmod(nanos, 10**9)
    return response

