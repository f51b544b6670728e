"""Reading rendered Envoy configs in tests."""

from __future__ import annotations

from typing import Any, Iterator


def ext_proc_filters(node: Any) -> Iterator[dict[str, Any]]:
    """Every ext_proc filter's typed_config in an Envoy bootstrap (all listeners)."""
    if isinstance(node, dict):
        if node.get("name") == "envoy.filters.http.ext_proc":
            yield node["typed_config"]
        for v in node.values():
            yield from ext_proc_filters(v)
    elif isinstance(node, list):
        for v in node:
            yield from ext_proc_filters(v)
