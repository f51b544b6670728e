"""Machine facts for benchmark, evaluation and model-card reports: the one place that reads them.

CPU name and SIMD flags come from py-cpuinfo, core counts and memory from psutil (both in the
`eval` extra, which `dev` and `train` include); without them the CPU name falls back to
`platform` and the physical-core / memory fields are None, so a report never fails for lack
of a fact. GPU: the CUDA device onnxruntime would run on, when its CUDA provider is present
(named by `nvidia-smi` if that is on PATH).

    machine_info()   -> dict for a results JSON (stable keys, listed in `machine_info`'s docstring)
    machine_line()   -> "Intel(R) Xeon(R) Processor, 2 cores, no GPU, Linux 6.18, load average at start 0.97"

Never imported by the serving path.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from typing import Any

SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")  # what matters to onnxruntime's int8 kernels


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, Any]:
    try:
        import cpuinfo  # py-cpuinfo: about a second (it runs CPUID in a child process), hence the cache
    except ImportError:
        return {}
    try:
        return dict(cpuinfo.get_cpu_info())
    except Exception:  # noqa: BLE001 - an unreadable CPU must not fail a report
        return {}


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC"), else what `platform` knows ("x86_64")."""
    return _cpuinfo().get("brand_raw") or platform.processor() or platform.machine() or "unknown CPU"


def simd() -> list[str]:
    """The SIMD extensions of SIMD_FLAGS this CPU has (empty when unknown)."""
    flags = set(_cpuinfo().get("flags") or ())
    return [f for f in SIMD_FLAGS if f in flags]


def logical_cores() -> int | None:
    try:
        import psutil
    except ImportError:
        return os.cpu_count()
    return psutil.cpu_count(logical=True)


def physical_cores() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.cpu_count(logical=False)


def memory_gib() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return round(psutil.virtual_memory().total / 2**30, 1)


def load_average_1m() -> float:
    """Above the core count: other jobs shared the CPU while measuring."""
    return round(os.getloadavg()[0], 2)


@functools.lru_cache(maxsize=1)
def gpu() -> str | None:
    """The CUDA GPU onnxruntime can use, or None (no CUDA provider)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=10).stdout.strip().splitlines()
            if out:
                return out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return "CUDA"


def onnxruntime_version() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return ort.__version__


def machine_info() -> dict[str, Any]:
    """cpu, logical_cpus, physical_cpus, memory_gib, simd, gpu (None: none), onnxruntime, python, os,
    load_average_1m."""
    return {
        "cpu": cpu_name(),
        "logical_cpus": logical_cores(),
        "physical_cpus": physical_cores(),
        "memory_gib": memory_gib(),
        "simd": simd(),
        "gpu": gpu(),
        "onnxruntime": onnxruntime_version(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "load_average_1m": load_average_1m(),
    }


def machine_line(load: str | None = "at start", kernel: bool = True) -> str:
    """One line for a report's "Machine:": CPU, cores, GPU, kernel, and the 1-minute load average
    labelled `load` ("at start", "at end"; None leaves it out)."""
    g = gpu()
    parts = [cpu_name(), f"{logical_cores()} cores", f"GPU {g}" if g else "no GPU"]
    if kernel:
        parts.append(f"{platform.system()} {platform.release()}")
    if load is not None:
        parts.append(f"load average {load} {os.getloadavg()[0]:.2f}")
    return ", ".join(parts)
