"""What the image's build stage installs: a wheel built from exactly the files the
Dockerfile COPYs (after the .dockerignore), with every extproc module in it, that runs the
CLI on its own. This is the part of `docker build` that can run without a Docker engine."""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

from tests.deploy.support import ROOT, dockerfile_stages, run


def _build_context_sources() -> list[str]:
    copies = [i for i in dockerfile_stages()["build"] if i.startswith("COPY")]
    return [s.rstrip("/") for i in copies for s in i.split()[1:-1] if not s.startswith("--")]


def test_build_stage_wheel_is_complete_and_runs(tmp_path: Path) -> None:
    sources = _build_context_sources()
    assert sources == ["pyproject.toml", "README.md", "extproc"]
    src = tmp_path / "src"
    src.mkdir()
    for rel in sources:
        path = ROOT / rel
        if path.is_dir():
            shutil.copytree(path, src / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / rel)
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("truthlens-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        in_wheel = {n for n in zf.namelist() if n.startswith("extproc/") and n.endswith(".py")}
        zf.extractall(tmp_path / "site")
    in_repo = {p.relative_to(ROOT).as_posix() for p in (ROOT / "extproc").rglob("*.py")}
    assert in_wheel == in_repo, f"missing from the image: {sorted(in_repo - in_wheel)}"

    # the installed copy (not the repository's) validates a config and loads the serve command
    site = str(tmp_path / "site")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import extproc, extproc.commands.serve\n"
        "assert extproc.__file__.startswith(sys.argv[1]), extproc.__file__\n"
        "from extproc.cli import main\n"
        "sys.exit(main(['check-config', sys.argv[2]]))\n"
    )
    proc = run([sys.executable, "-c", code, site, str(ROOT / "docs" / "truthlens.example.yaml")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK:")
