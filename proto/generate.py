"""Compile proto/truthlens/v1/*.proto into extproc/api/v1/ with grpcio-tools.

    python proto/generate.py            write the generated modules
    python proto/generate.py --check    exit 1 when the committed ones differ from a fresh build

The generated modules are committed, so serving needs neither grpcio-tools nor a build step
(`pip install .`, the Docker image and `make run` work on a fresh clone); `make test` runs
tests/unit/api/test_proto.py, which compiles the protos into a temporary directory and fails
when the committed code is not current. grpcio-tools is pinned in the `dev` extra: its protoc
decides the gencode version, which must not exceed the protobuf runtime (see pyproject.toml).

protoc writes absolute imports (`from truthlens.v1 import detection_pb2`); they are rewritten
to the package the modules live in (`from extproc.api.v1 import ...`).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGE = "truthlens/v1"
OUT = ROOT / "extproc" / "api" / "v1"
PY_PACKAGE = "extproc.api.v1"


def protos() -> list[Path]:
    return sorted((PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))


def compile_into(out: Path) -> dict[str, str]:
    """Run grpcio-tools' protoc; returns {file name: generated text} with the imports rewritten."""
    from grpc_tools import protoc  # dev-only: serving imports the committed output

    with tempfile.TemporaryDirectory(prefix="truthlens-proto-") as tmp:
        include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", *(str(p.relative_to(PROTO_ROOT)) for p in protos())]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed: {' '.join(args)}")
        dotted = PROTO_PACKAGE.replace("/", ".")
        files = {}
        for path in sorted((Path(tmp) / PROTO_PACKAGE).iterdir()):
            text = path.read_text()
            text = re.sub(rf"^from {re.escape(dotted)} import ", f"from {PY_PACKAGE} import ", text, flags=re.M)
            files[path.name] = text
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    return files


def stale(out: Path = OUT) -> list[str]:
    """Generated files that are missing or differ from a fresh compile (empty: current)."""
    with tempfile.TemporaryDirectory(prefix="truthlens-proto-check-") as tmp:
        fresh = compile_into(Path(tmp))
    return [name for name, text in fresh.items()
            if not (out / name).is_file() or (out / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail when extproc/api/v1 is not current")
    args = p.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(f"extproc/api/v1 is not current ({', '.join(bad)}): run python proto/generate.py", file=sys.stderr)
            return 1
        return 0
    for name in compile_into(OUT):
        print(f"wrote {(OUT / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
