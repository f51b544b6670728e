"""bench/ is a package: every script runs as `python -m bench.<name>`, none edits sys.path or reads
/proc/cpuinfo, and the shared helpers behave."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from bench import common

BENCH = Path(__file__).resolve().parents[3] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("__init__", "common", "inference_report"))


def test_no_script_edits_sys_path_or_parses_cpuinfo() -> None:
    for path in BENCH.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "sys.path" not in text, path
        assert "/proc/cpuinfo" not in text, path
        assert "from extproc.commands" not in text, path  # CLI commands are not a library
        # bench modules import each other only through the package
        assert not re.search(r"^\s*(from|import) (gateway_bench|noop_processor|inference_report)\b", text, re.M), path


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # another test imported it first
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_is_a_module_with_help(name: str) -> None:
    import runpy

    argv = sys.argv
    sys.argv = [name, "--help"]
    try:
        with pytest.raises(SystemExit) as exc:
            runpy.run_module(f"bench.{name}", run_name="__main__")
    finally:
        sys.argv = argv
    assert exc.value.code == 0


def test_command_is_repeatable_from_the_repository_root() -> None:
    line = common.command("bench.x", ["--out", str(common.REPO / "bench/results/x.md"), "--prompt", "a b"])
    assert re.fullmatch(r"(nice -n \d+ )?\S+ -m bench\.x --out bench/results/x\.md --prompt 'a b'", line), line


def test_percentile_time_ms_and_write_results(tmp_path: Path) -> None:
    assert common.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert common.percentile([1.0, 2.0], 0.99) == 2.0
    calls = []
    times = common.time_ms(lambda: calls.append(1), runs=4, warmup=2)
    assert len(times) == 4 and len(calls) == 6 and all(t >= 0 for t in times)
    out = common.write_results(tmp_path / "deep" / "r.md", "# r\n", {"a": 1})
    assert out.read_text() == "# r\n" and json.loads(out.with_suffix(".json").read_text()) == {"a": 1}
