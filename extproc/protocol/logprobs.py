"""The upstream's own token log-probabilities: ask for them, read them, and take them out again.

A decision may ask the upstream for `logprobs` / `top_logprobs` when the client did not
(`truthlens.signals.upstream_logprobs`). Then the client must get the body it would have got: the
`logprobs` member of every choice is cut out of the upstream's bytes (JSON body or each SSE event),
and nothing else changes, byte for byte. Cutting works on the raw bytes (a small JSON scanner finds
the member's extent), because re-serializing would change spacing, escapes and number spelling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from extproc.protocol.openai import ProtocolError, dump_json, read_json

__all__ = ["TokenLogprob", "ask_for_logprobs", "choice_logprobs", "strip_choice_logprobs", "strip_event_logprobs"]

_WS = b" \t\r\n"


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    logprob: float  # of the token the upstream chose
    top: tuple[float, ...]  # log-probabilities of its top alternatives (the chosen one usually among them)


def ask_for_logprobs(body: bytes, top_logprobs: int) -> bytes | None:
    """The request body asking for logprobs, or None when the client asked already (nothing to add or strip)."""
    try:
        obj = read_json(body)
    except (json.JSONDecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"request body: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("logprobs"):
        return None
    obj["logprobs"] = True
    if top_logprobs > 0:
        obj["top_logprobs"] = top_logprobs
    return dump_json(obj)


def choice_logprobs(obj: Any) -> dict[int, list[TokenLogprob]]:
    """Per choice index, the tokens of `choices[].logprobs.content` (a chat.completion or one chunk)."""
    out: dict[int, list[TokenLogprob]] = {}
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return out
    for pos, choice in enumerate(choices):
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", pos)
        lp = choice.get("logprobs")
        content = lp.get("content") if isinstance(lp, dict) else None
        if not isinstance(index, int) or not isinstance(content, list):
            continue
        tokens = out.setdefault(index, [])
        for item in content:
            if not isinstance(item, dict) or not _number(item.get("logprob")):
                continue
            top = item.get("top_logprobs")
            alts = tuple(float(t["logprob"]) for t in top if isinstance(t, dict) and _number(t.get("logprob"))) \
                if isinstance(top, list) else ()
            tokens.append(TokenLogprob(float(item["logprob"]), alts))
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def strip_choice_logprobs(raw: bytes) -> bytes:
    """`raw` (one JSON object) without the `logprobs` member of any element of its `choices` array;
    every other byte as it was. Unparsable input comes back unchanged."""
    try:
        cuts = _logprobs_members(raw)
    except (IndexError, ValueError):
        return raw
    if not cuts:
        return raw
    out, pos = bytearray(), 0
    for start, end in cuts:
        out += raw[pos:start]
        pos = end
    out += raw[pos:]
    return bytes(out)


def _logprobs_members(raw: bytes) -> list[tuple[int, int]]:
    """Byte ranges to cut: each choice's `"logprobs": value` with one adjacent comma."""
    i = _skip_ws(raw, 0)
    if raw[i:i + 1] != b"{":
        return []
    cuts: list[tuple[int, int]] = []
    for key, _k_start, v_start, v_end in _members(raw, i):
        if key == "choices" and raw[v_start:v_start + 1] == b"[":
            for e_start, _e_end in _elements(raw, v_start):
                if raw[e_start:e_start + 1] == b"{":
                    members = list(_members(raw, e_start))
                    for n, (k, k_start, _vs, ve) in enumerate(members):
                        if k == "logprobs":
                            cuts.append(_with_comma(raw, k_start, ve, first=n == 0, last=n == len(members) - 1))
    return cuts


def _with_comma(raw: bytes, start: int, end: int, first: bool, last: bool) -> tuple[int, int]:
    """Widen a member's range by the comma that separates it, so the object stays valid JSON."""
    if not last:  # cut up to the next member: `"logprobs": v, ` goes
        j = _skip_ws(raw, end)
        return start, _skip_ws(raw, j + 1)
    if not first:  # the last member: the comma before it goes
        j = start - 1
        while raw[j] in _WS:
            j -= 1
        return j, end
    return start, end  # the only member


def _members(raw: bytes, i: int):
    """(key, key start, value start, value end) of the object starting at raw[i] == '{'."""
    return _items(raw, i, b"}", _member)


def _member(raw: bytes, k_start: int) -> tuple[tuple[Any, int, int, int], int]:
    k_end = _skip_value(raw, k_start)
    key = json.loads(raw[k_start:k_end])
    i = _skip_ws(raw, k_end)
    if raw[i:i + 1] != b":":
        raise ValueError("expected ':'")
    v_start = _skip_ws(raw, i + 1)
    v_end = _skip_value(raw, v_start)
    return (key, k_start, v_start, v_end), v_end


def _elements(raw: bytes, i: int):
    """(start, end) of each element of the array starting at raw[i] == '['."""
    return _items(raw, i, b"]", lambda raw, start: ((start, end := _skip_value(raw, start)), end))


def _items(raw: bytes, i: int, close: bytes, item: Callable[[bytes, int], tuple[Any, int]]):
    """What `item(raw, start)` reads from each item of the object or array opening at raw[i], up to `close`;
    `item` also returns where its item ends, and the separators between items are checked here."""
    i = _skip_ws(raw, i + 1)
    if raw[i:i + 1] == close:
        return
    while True:
        found, end = item(raw, i)
        yield found
        i = _skip_ws(raw, end)
        if raw[i:i + 1] == b",":
            i = _skip_ws(raw, i + 1)
        elif raw[i:i + 1] == close:
            return
        else:
            raise ValueError(f"expected ',' or '{close.decode()}'")


def _skip_ws(raw: bytes, i: int) -> int:
    while i < len(raw) and raw[i] in _WS:
        i += 1
    return i


def _skip_value(raw: bytes, i: int) -> int:
    """The end of the JSON value starting at raw[i] (strings, nesting; scalars up to a delimiter)."""
    c = raw[i]
    if c == 0x22:  # "
        j = i + 1
        while True:
            j = raw.index(b'"', j)
            k = j - 1
            while raw[k] == 0x5C:  # count the backslashes before the quote
                k -= 1
            if (j - 1 - k) % 2 == 0:
                return j + 1
            j += 1
    if c in (0x7B, 0x5B):  # { [
        depth, j = 0, i
        while True:
            ch = raw[j]
            if ch == 0x22:
                j = _skip_value(raw, j)
                continue
            if ch in (0x7B, 0x5B):
                depth += 1
            elif ch in (0x7D, 0x5D):
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
    j = i
    while j < len(raw) and raw[j] not in b",}] \t\r\n":
        j += 1
    if j == i:
        raise ValueError("expected a value")
    return j


def strip_event_logprobs(block: bytes) -> bytes:
    """One SSE event block without its choices' `logprobs`; a block whose data spans several lines, or is
    not a JSON object, comes back unchanged."""
    lines = block.split(b"\n")
    data = [n for n, line in enumerate(lines) if line.startswith(b"data:")]
    if len(data) != 1 or b'"logprobs"' not in block:
        return block
    n = data[0]
    line = lines[n]
    head = 6 if line.startswith(b"data: ") else 5
    cr = line.endswith(b"\r")
    payload = line[head:len(line) - 1] if cr else line[head:]
    lines[n] = line[:head] + strip_choice_logprobs(payload) + (b"\r" if cr else b"")
    return b"\n".join(lines)
