"""The one place reports read machine facts from: stable keys, a one-line summary, and no failure
when py-cpuinfo / psutil are missing."""

from __future__ import annotations

import builtins
import os

import pytest

from extproc.evaluation import machine


def test_machine_info_keys_and_types() -> None:
    m = machine.machine_info()
    assert set(m) == {"cpu", "logical_cpus", "physical_cpus", "memory_gib", "simd", "gpu", "onnxruntime", "python",
                      "os", "load_average_1m"}
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert m["logical_cpus"] == os.cpu_count()
    assert set(m["simd"]) <= set(machine.SIMD_FLAGS)


def test_machine_line_names_cpu_cores_and_load() -> None:
    line = machine.machine_line("at end")
    assert line.startswith(f"{machine.cpu_name()}, {os.cpu_count()} cores, ")
    assert "load average at end " in line
    assert "load average" not in machine.machine_line(None)


def test_missing_libraries_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_extras(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name in ("cpuinfo", "psutil"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    machine._cpuinfo.cache_clear()
    monkeypatch.setattr(builtins, "__import__", no_extras)
    try:
        m = machine.machine_info()
        assert m["cpu"] and m["logical_cpus"] == os.cpu_count()
        assert m["physical_cpus"] is None and m["memory_gib"] is None and m["simd"] == []
    finally:
        monkeypatch.undo()
        machine._cpuinfo.cache_clear()
