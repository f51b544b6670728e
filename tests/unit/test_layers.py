"""The package layout of docs/architecture.md, enforced: imports point down only, the serving
path never reaches dev-only code, and the top level of extproc/ keeps only entry points."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "extproc"
# What each package may import from the rest of extproc (its own modules are always allowed).
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "telemetry": set(),
    "config": set(),
    "inference": set(),
    "policy": {"config", "inference"},  # config types, the engine's result types (inference/api.py)
    "evaluation": {"config", "inference"},
    "gateway": {"config", "inference", "policy", "protocol", "telemetry", "api"},
    "api": {"config", "inference", "server"},
    "devtools": {"config", "protocol"},
    "server": {"config"},
}
ENTRY_POINTS = {"__init__.py", "cli.py", "server.py"}


def imports_of(path: Path) -> set[str]:
    """extproc.* modules a file imports (anywhere in it: lazy imports count; TYPE_CHECKING ones do not)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names] if node.module == "extproc" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n.startswith("extproc.")}
    return out


def layer(module: str) -> str:
    """extproc.gateway.exchange -> gateway; extproc.server -> server."""
    return module.split(".")[1].removesuffix(".py")


def source_files(package: str) -> list[Path]:
    target = PKG / package
    if target.is_dir():
        return [p for p in target.rglob("*.py") if "v1" not in p.relative_to(target).parts]  # generated gencode
    return [PKG / f"{package}.py"]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down_only(package: str) -> None:
    bad = sorted(f"{path.relative_to(PKG)} imports {mod}" for path in source_files(package)
                 for mod in imports_of(path) if layer(mod) not in ALLOWED[package] | {package})
    assert not bad, "\n".join(bad)


def test_only_commands_and_the_cli_reach_dev_only_code() -> None:
    users = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                   if any(layer(m) == "devtools" for m in imports_of(p))
                   and p.relative_to(PKG).parts[0] not in ("devtools", "commands", "cli.py"))
    assert not users


def test_top_level_holds_only_entry_points() -> None:
    modules = {p.name for p in PKG.glob("*.py")}
    assert modules <= ENTRY_POINTS and len(modules) <= 4


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rule above is only as good as import detection: lazy and aliased imports are found."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from extproc.gateway import exchange as x\n    import extproc.devtools.demo_upstream\n"
                 "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from extproc.commands import dev\n")
    assert imports_of(f) == {"extproc.gateway", "extproc.devtools.demo_upstream"}
