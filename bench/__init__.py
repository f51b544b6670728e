"""Benchmarks: each module runs from the repository root as `python -m bench.<name> --help`.

Shared helpers (machine facts, timing, percentiles, the command line, writing results) live in
`bench.common`; results go to bench/results/ as markdown + JSON.
"""
