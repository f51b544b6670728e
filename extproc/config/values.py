"""Syntax checks for single config values.

Each `check_*` returns None when the value is fine, else a short phrase for
"expected ...", which the loader turns into `<key.path>: expected <phrase>, got <value>`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")
_DOMAIN_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 header field name
_TAG_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")  # an XML-like tag name


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host without brackets, port); ValueError if malformed."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not _HOST_RE.match(host) or not port_text.isdigit():
        raise ValueError(address)
    port = int(port_text)
    if port > 65535:
        raise ValueError(address)
    return host.strip("[]"), port


def check_host_port(value: str) -> str | None:
    try:
        split_host_port(value)
    except ValueError:
        return "host:port with a port in 0..65535"
    return None


def check_listen_address(value: str) -> str | None:
    if value.startswith("unix:"):
        return None if len(value) > len("unix:") else "host:port or unix:/path"
    return None if check_host_port(value) is None else "host:port or unix:/path"


def check_grpc_target(value: str) -> str | None:
    """A detector-pool endpoint: `host:port`, or `dns:///host:port` (every address the name resolves to)."""
    host_port = value[len("dns:///"):] if value.startswith("dns:///") else value
    return None if check_host_port(host_port) is None else "host:port or dns:///host:port"


def check_http_url(value: str) -> str | None:
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # raises on a bad port
    except ValueError:
        ok = False
    return None if ok else "an http:// or https:// URL with a host"


def check_nonblank(value: str) -> str | None:
    return None if value.strip() else "a non-empty string"


def check_name(value: str) -> str | None:
    """Decision names travel in a response header and a metric label: keep them plain."""
    return None if _NAME_RE.match(value) else "a name of letters, digits, '.', '_' or '-' (at most 63)"


def check_domain(value: str) -> str | None:
    return None if _DOMAIN_RE.match(value.lower().rstrip(".")) else "a host name like example.com"


def check_header_name(value: str) -> str | None:
    return None if _TOKEN_RE.match(value) else "an HTTP header name"


def check_regex(value: str) -> str | None:
    """A Python regular expression; the phrase carries the compiler's complaint."""
    try:
        re.compile(value)
    except re.error as exc:
        return f"a valid regular expression ({exc})"
    return None


def check_tag_name(value: str) -> str | None:
    return None if _TAG_RE.match(value) else "a tag name without brackets, like documents"
