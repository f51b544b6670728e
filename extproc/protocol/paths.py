"""Which request paths are the chat-completions API: the gateway judges every spelling of it.

Public API (pure functions, no project imports):

- ``normalize_path(path) -> str``: the path an upstream might route on, taken generously
- ``is_chat_path(path) -> bool``: ``normalize_path(path)`` ends with ``/chat/completions``

Envoy forwards the path it was sent (the HCM's `normalize_path` / `merge_slashes` resolve dot
segments and double slashes, nothing else), and upstream servers differ in what they accept as
the same route: some decode `%2F`, drop `;params`, or match without case. A spelling the gateway
did not recognize used to pass with no verdict and with the RAG field forwarded (#19), so the
test here over-approximates: it is true whenever *some* common server would route the path to
chat completions. Judging a path that is not chat costs nothing worse than an `unchecked` verdict.

Steps, in order: drop the query and fragment; percent-decode (repeatedly, for double encoding);
`\\` counts as `/`; drop every segment's `;params`; resolve `.` and `..`; drop empty segments;
lower-case.
"""

from __future__ import annotations

from urllib.parse import unquote

__all__ = ["CHAT_PATH_SUFFIX", "is_chat_path", "normalize_path"]

CHAT_PATH_SUFFIX = "/chat/completions"
_MAX_DECODES = 4  # %25252F ... : stop somewhere


def normalize_path(path: str) -> str:
    path = path.split("?", 1)[0].split("#", 1)[0]
    for _ in range(_MAX_DECODES):
        if "%" not in path:
            break
        decoded = unquote(path, errors="replace")
        if decoded == path:
            break
        path = decoded
    out: list[str] = []
    for segment in path.replace("\\", "/").split("/"):
        segment = segment.split(";", 1)[0]
        if segment in ("", "."):
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    return "/" + "/".join(out).lower()


def is_chat_path(path: str) -> bool:
    """True for every spelling of a chat-completions path (prefixes such as Azure's deployments too)."""
    if path == "/v1/chat/completions":  # the canonical spelling, at no cost
        return True
    return normalize_path(path).endswith(CHAT_PATH_SUFFIX)
