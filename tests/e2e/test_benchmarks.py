"""The gateway benchmarks still run end to end (tiny sizes; no timing is asserted, only that each
setup answered and the reports carry what docs/gateway.md quotes from them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gateway_bench_runs_every_setup_and_reports_the_targets(tmp_path: Path) -> None:
    out = tmp_path / "gateway.md"
    subprocess.run(
        [sys.executable, "-m", "bench.gateway_bench", "--requests", "24", "--rounds", "2", "--warmup", "4",
         "--concurrency", "1", "4", "--out", str(out)],
        cwd=REPO, check=True, capture_output=True, timeout=300,
    )
    results = json.loads(out.with_suffix(".json").read_text())
    setups = results["setups"]
    assert set(setups) == {"direct upstream", "bare Envoy", "Envoy + do-nothing ext_proc",
                           "Envoy + TruthLens (non-factual prompt)"}
    for label, rows in setups.items():
        assert [r["concurrency"] for r in rows] == [1, 4]
        for r in rows:
            assert r["requests"] == 24 and len(r["round_p50_ms"]) == 2 and r["rps"] > 0
    assert setups["Envoy + TruthLens (non-factual prompt)"][0]["verdict_statuses"] == {"skipped": 24}
    assert setups["Envoy + do-nothing ext_proc"][0]["sidecar_cpu_ms_per_request"] > 0
    report = out.read_text()
    assert "| 1 | " in report and "| 4 | " in report and "## Target" in report
    assert "decides this prompt" in report  # the automatic note says how the prompt was classified


def test_hotpath_bench_times_both_processors(tmp_path: Path) -> None:
    out = tmp_path / "hotpath.md"
    subprocess.run(
        [sys.executable, "-m", "bench.hotpath_bench", "--requests", "200", "--repeats", "2", "--out", str(out),
         "--note", "smoke"],
        cwd=REPO, check=True, capture_output=True, timeout=300,
    )
    r = json.loads(out.with_suffix(".json").read_text())
    assert len(r["truthlens_us"]) == 2 and len(r["noop_us"]) == 2
    assert all(x > 0 for x in r["truthlens_us"] + r["noop_us"])
    assert r["decided_by"] == "prefilter"
    assert "| TruthLens |" in out.read_text() and "* smoke" in out.read_text()


def test_sentinel_batching_bench_reports_the_batch_effect(tmp_path: Path) -> None:
    out = tmp_path / "sentinel-batching.md"
    prompts = tmp_path / "prompts.txt"  # generated here: the test needs no ../shared
    subjects = ("the Nile", "Mount Everest", "the Moon", "Python lists", "autumn leaves", "a pirate ship")
    prompts.write_text("\n".join([f"How long is {s}?" for s in subjects] + [f"Write a poem about {s}." for s in subjects]
                                 + [f"Tell me something about {s} in one line" for s in subjects]
                                 + [f"Can you explain {s} to a child, please?" for s in subjects]), encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "bench.sentinel_batching", "--prompts-file", str(prompts), "--out", str(out),
         "--note", "smoke"],
        cwd=REPO, check=True, capture_output=True, timeout=300,
    )
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["model"] == "models/sentinel"
    assert row["same_prompt_repeated"]["max"] == 0.0  # identical rows: identical int8 scales
    assert row["same_length_mate"]["n"] + row["longer_mate"]["n"] > 0 and row["single_prompt_ms_p50"] > 0
    assert 0 <= row["batches_of_8_flips"] <= 24
    report = out.read_text()
    assert "| `models/sentinel` |" in report and "* smoke" in report
