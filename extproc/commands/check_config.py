"""`truthlens check-config FILE`: validate a config without starting anything.

Exit 0 and "OK: FILE" (plus warnings on stderr) when the gateway would start,
exit 1 with every error, one per line and key path first, when it would not
(e.g. standard mode without truthlens.modes.standard.upstream_url, premium without verifiers).
It checks the file only: whether the LLMs it names answer is checked by `truthlens serve` at startup.
`--print` dumps the effective config, defaults filled in, as YAML.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="YAML config file")
    parser.add_argument(
        "--print",
        dest="print_config",
        action="store_true",
        help="print the effective config (defaults filled in) as YAML to stdout",
    )
    parser.add_argument(
        "--upstream-url",
        default=None,
        help="as `truthlens serve --upstream-url`: fills truthlens.modes.standard.upstream_url where the file leaves it null",
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from extproc.commands.serve import read_config
    from extproc.config import ConfigError, config_to_dict, config_warnings

    try:
        cfg = read_config(args.file, args.upstream_url)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print(f"INVALID: {args.file} ({len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''})", file=sys.stderr)
        return 1
    for warning in config_warnings(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    if args.print_config:
        sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True, width=1000))
    else:
        print(f"OK: {args.file}")
    return 0
