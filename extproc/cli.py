"""`truthlens` command line: the only place that reads argv.

Each subcommand lives in its own module under `extproc.commands` exposing
`add_arguments(parser)` and `run(args) -> int`; modules are imported lazily so
`truthlens check-config` never pays for onnxruntime and `truthlens export`
is the only path that imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("extproc.commands.serve", "run the ext_proc sidecar"),
    "check-config": ("extproc.commands.check_config", "validate a TruthLens YAML config and exit"),
    "dev": ("extproc.commands.dev", "start demo upstream + sidecar + Envoy on loopback (what `make run` does)"),
    "detect": ("extproc.commands.detect", "score one example and print spans, scores and NLI labels as JSON"),
    "eval": ("extproc.commands.eval", "evaluate the detector on a JSONL file and write metrics"),
    "export": ("extproc.commands.export", "export a Hugging Face checkpoint (or a GGUF causal LM) to a TruthLens model directory"),
    "calibrate": ("extproc.commands.calibrate", "fit the LatentAudit signal (surrogate hidden states) on labelled answers"),
    "fit-upstream": ("extproc.commands.fit_upstream",
                     "fit per writer model the response score stacked with its own token logprobs (upstream_fusion)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Only the chosen subcommand's module is imported, so one heavy or broken
    command never slows down or breaks the others."""
    parser = argparse.ArgumentParser(prog="truthlens", description="TruthLens hallucination firewall")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
