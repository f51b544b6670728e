"""Walk the config schema over a parsed YAML mapping, collecting every error.

Generic over `extproc.config.schema`: type hints give the expected types,
field metadata (min/max/check/nonempty/unique_names) the constraints. Invalid
optional fields fall back to their defaults so later checks still run and
report their own errors in the same pass.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
from functools import cache
from typing import Any, Literal, Mapping, Union, get_args, get_origin, get_type_hints

from extproc.config.schema import CONDITION_KEYS, ConditionConfig

INVALID = object()


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def show_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list" if value else "an empty list"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return f"{_describe(inner[0])} or null"
    if origin is Literal:
        return "one of " + " | ".join(str(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _bounds(meta: Mapping[str, Any], tp: Any) -> str:
    lo, hi = meta.get("min"), meta.get("max")
    kind = "an integer" if tp is int else "a number"
    if lo is not None and hi is not None:
        return f"{kind} in [{lo:g}, {hi:g}]"
    return f"{kind} >= {lo:g}" if lo is not None else f"{kind} <= {hi:g}"


class SchemaWalker:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, expected: str, got: Any, raw: bool = False) -> object:
        self.errors.append(f"{path or '<root>'}: expected {expected}, got {got if raw else show_value(got)}")
        return INVALID

    def build(self, cls: type, data: Any, path: str) -> Any:
        if not isinstance(data, Mapping):
            return self.fail(path, "a mapping", data)
        hints = _hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        allowed, required = set(fields), {n for n, f in fields.items() if _is_required(f)}
        if cls is ConditionConfig:
            allowed, required = self._condition_keys(data, path)
        kwargs: dict[str, Any] = {}
        complete = True
        for key in data:
            if key not in allowed:
                self._unknown_key(path, key, allowed, set(fields))
        for name in sorted(allowed, key=list(fields).index):
            sub = f"{path}.{name}" if path else name
            if name not in data:
                if name in required:
                    complete = False
                    expected = _describe(_non_null(hints[name]))
                    self.fail(sub, expected, "nothing (required key missing)", raw=True)
                continue
            hint = hints[name]
            if name in required:  # e.g. a header condition's `name`, optional for other condition types
                hint = _non_null(hint)
            value = self.value(hint, data[name], sub, fields[name].metadata)
            if cls is ConditionConfig and name in required and value == () and not data[name]:
                value = self.fail(sub, "a non-empty list", data[name])
            if value is INVALID:
                complete = complete and name not in required
            else:
                kwargs[name] = value
        return cls(**kwargs) if complete else INVALID

    def _condition_keys(self, data: Mapping[str, Any], path: str) -> tuple[set[str], set[str]]:
        ctype = data.get("type")
        if ctype not in CONDITION_KEYS:
            return {"type"}, {"type"}  # the walk then reports the bad/missing type once
        extra, required = CONDITION_KEYS[ctype]
        return {"type", *extra}, {"type", *required}

    def _unknown_key(self, path: str, key: Any, allowed: set[str], all_fields: set[str]) -> None:
        sub = f"{path}.{key}" if path else str(key)
        if key in all_fields:  # a condition field that belongs to another condition type
            self.fail(sub, f"only {', '.join(sorted(allowed))} for this condition type", f"key {key!r}", raw=True)
            return
        close = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(sorted(allowed))})"
        self.fail(sub, "a known key" + hint, f"unknown key {key!r}", raw=True)

    def value(self, tp: Any, data: Any, path: str, meta: Mapping[str, Any], nullable: bool = False) -> Any:
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):
            return None if data is None else self.value(_non_null(tp), data, path, meta, nullable=True)
        or_null = " or null" if nullable else ""
        if origin is Literal:
            if isinstance(data, str) and data in get_args(tp):
                return data
            return self.fail(path, _describe(tp) + or_null, data)
        if origin is tuple:
            if not isinstance(data, list | tuple):
                return self.fail(path, _describe(tp), data)
            if meta.get("nonempty") and not data:
                return self.fail(path, "a non-empty list", data)
            items = [self.value(get_args(tp)[0], v, f"{path}[{i}]", meta) for i, v in enumerate(data)]
            if meta.get("unique_names"):
                self._unique_names(path, data)
            return tuple(v for v in items if v is not INVALID)
        if dataclasses.is_dataclass(tp):
            return self.build(tp, data, path)
        return self.scalar(tp, data, path, meta, or_null)

    def _unique_names(self, path: str, items: list[Any] | tuple[Any, ...]) -> None:
        first: dict[str, int] = {}
        for i, item in enumerate(items):
            name = item.get("name") if isinstance(item, Mapping) else None
            if isinstance(name, str) and name in first:
                self.fail(f"{path}[{i}].name", "a unique name", f"{name!r} (also {path}[{first[name]}])", raw=True)
            elif isinstance(name, str):
                first[name] = i

    def scalar(self, tp: Any, data: Any, path: str, meta: Mapping[str, Any], or_null: str = "") -> Any:
        raw = data
        if tp is bool:
            ok = isinstance(data, bool)
        elif tp is int:
            ok = isinstance(data, int) and not isinstance(data, bool)
        elif tp is float:
            ok = isinstance(data, int | float) and not isinstance(data, bool) and math.isfinite(data)
            data = float(data) if ok else data
        else:
            ok = isinstance(data, tp)
        if not ok:
            return self.fail(path, _describe(tp) + or_null, data)
        lo, hi = meta.get("min"), meta.get("max")
        if (lo is not None and data < lo) or (hi is not None and data > hi):
            return self.fail(path, _bounds(meta, tp), raw)
        check = meta.get("check")
        expected = check(data) if check is not None else None
        return self.fail(path, expected, raw) if expected else data


def _non_null(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        return [a for a in get_args(tp) if a is not type(None)][0]
    return tp


def _is_required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
