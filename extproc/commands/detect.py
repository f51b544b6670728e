"""`truthlens detect`: score one example and print spans, scores and NLI labels as JSON.

Input from flags (`--context` repeatable, `--question`, `--answer`) or, when
`--answer` is absent, one JSON object on stdin with the eval record fields
(`context`, `question`, `answer`; `id`, `labels` and `task` are ignored).
Exit 0 on success, 2 on bad input, 1 when the detector cannot run.
"""

from __future__ import annotations

import argparse
import json
import sys

from extproc.commands.eval import add_model_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context", action="append", default=None, metavar="TEXT", help="grounding document (repeat for several)"
    )
    parser.add_argument("--question", default=None, metavar="TEXT", help="the user question (optional)")
    parser.add_argument("--answer", default=None, metavar="TEXT", help="the answer to check; omit to read JSON from stdin")
    add_model_arguments(parser)
    parser.add_argument("--compact", action="store_true", help="print JSON on one line")


class InputError(ValueError):
    pass


def read_input(args: argparse.Namespace, stdin_text: str | None) -> tuple[tuple[str, ...], str | None, str]:
    """(context, question, answer) from flags, else from one JSON object on stdin."""
    if args.answer is not None:
        if not args.context:
            raise InputError("--context is required with --answer (repeat it for several documents)")
        return tuple(args.context), args.question, args.answer
    if stdin_text is None or not stdin_text.strip():
        raise InputError("no input: pass --context/--answer, or a JSON object on stdin")
    from extproc.evaluation.dataset import DatasetError, parse_jsonl

    record_text = stdin_text.strip()
    try:
        obj = json.loads(record_text)
    except json.JSONDecodeError as exc:
        raise InputError(f"stdin: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if isinstance(obj, dict):
        # `id` and `labels` are optional here; fill them so the eval validator can check the rest
        obj = {"id": "stdin", "labels": [], **obj}
    try:
        (ex,) = parse_jsonl(json.dumps(obj), "stdin")
    except DatasetError as exc:
        raise InputError("\n".join(exc.errors)) from exc
    return ex.context, ex.question, ex.answer


def run(args: argparse.Namespace) -> int:
    from extproc.evaluation.scorer import ScorerError, open_scorer

    try:
        context, question, answer = read_input(args, None if args.answer is not None else sys.stdin.read())
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        scorer = open_scorer(args)
    except ScorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        result = scorer.detect(context, question, answer)
    except ScorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        scorer.close()
    print(json.dumps(result, ensure_ascii=False, indent=None if args.compact else 2))
    return 0
