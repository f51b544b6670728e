"""What the benchmarks share: the repository root, the machine, timing, percentiles, the command
line that reproduces a run, and writing a result's markdown + JSON.

Machine facts come from `extproc.evaluation.machine` (the same place model cards and the
real-output suite read them).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from extproc.evaluation.machine import cpu_name, machine_info, machine_line, simd  # noqa: F401 - re-exported

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def machine(load: str | None = "at start", kernel: bool = True) -> str:
    """"CPU, N cores, no GPU, Linux R, load average at start X.XX": the results' Machine line."""
    return machine_line(load, kernel=kernel)


def command(module: str, argv: Sequence[str] | None = None) -> str:
    """The command that repeats this run from the repository root: `[nice -n N] PYTHON -m MODULE ARGS`
    (PYTHON relative to the repository when it is the project's venv)."""
    python = Path(sys.executable)
    shown = os.path.relpath(python, REPO) if python.is_relative_to(REPO) else "python"
    args = [a.replace(str(REPO) + "/", "") for a in (sys.argv[1:] if argv is None else argv)]
    niceness = os.nice(0)
    return ("nice -n %d " % niceness if niceness else "") + shlex.join([shown, "-m", module, *args])


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO).stdout.strip() or "?"
    except OSError:
        return "?"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]: always one of the measured values."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def time_ms(fn: Callable[[], Any], runs: int, warmup: int = 3) -> list[float]:
    """Milliseconds of each of `runs` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def write_results(out: Path | str, markdown: str, data: Any = None) -> Path:
    """`markdown` to `out` (its folder made), and `data` as JSON beside it (`out` with suffix .json)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown, encoding="utf-8")
    if data is not None:
        out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return out
