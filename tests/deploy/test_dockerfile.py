"""The container recipe: hadolint-clean, non-root, both variants, models and health check
inside, and a .dockerignore that lets in exactly what the COPY lines need.
No Docker engine runs in CI (see docs/deploy.md), so the build itself is not exercised."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from tests.deploy.support import DOCKERFILE, ROOT, dockerfile_stages, hadolint_bin, run

DOCKERIGNORE = ROOT / "k8s" / "docker" / "Dockerfile.dockerignore"


def test_hadolint_passes() -> None:
    proc = run([hadolint_bin(), "--failure-threshold", "info", str(DOCKERFILE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_is_not_a_no_op(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    proc = run([hadolint_bin(), str(bad)])
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout  # `latest` tag


def test_both_variants_run_as_non_root_with_a_health_check() -> None:
    stages = dockerfile_stages()
    assert list(stages)[-1] == "cpu"  # a plain `docker build` gives the CPU image
    assert any("HEALTHCHECK" in i for i in stages["runtime-base"])
    for variant in ("cpu", "cuda"):
        assert stages[variant][0].split()[1] == "runtime-base"
        user = [i for i in stages[variant] if i.startswith("USER ")]
        assert user and not user[-1].split()[1].startswith(("0", "root"))
    assert any("onnxruntime-gpu" in i for i in stages["build-cuda"])
    # the CUDA image builds the int8 encoders' float twins at load (extproc/inference/float_graph.py): it needs onnx,
    # kept there (the CPU image's build stage uninstalls it after exporting the surrogate)
    assert any(re.search(r"\bonnx==", i) for i in stages["build-cuda"])
    assert any("--from=build-cuda" in i for i in stages["cuda"])
    assert any("--from=build " in i + " " for i in stages["cpu"])
    # CUDA libraries found through the loader cache built from the wheels, not a fixed path list
    assert any("ldconfig" in i and "site-packages/nvidia" in i for i in stages["cuda"])
    assert not any("LD_LIBRARY_PATH" in i for stage in stages.values() for i in stage)


def test_bundled_models_match_the_config_defaults() -> None:
    from extproc.config import default_config

    models = default_config().truthlens.models
    cpu_tier, quality_tier = models.detector_dirs  # detector: auto
    stages = dockerfile_stages()
    copies = " ".join(i for i in stages["runtime-base"] if i.startswith("COPY"))
    assert "WORKDIR /app" in stages["runtime-base"]
    for rel in (models.sentinel, cpu_tier, models.explainer):
        assert f"{rel}/ /app/{rel}/" in copies  # relative config paths resolve under WORKDIR /app
    # the quality tier serves where the models run on CUDA: in the CUDA image only
    assert quality_tier is not None and f"{quality_tier}/ /app/{quality_tier}/" not in copies
    assert any(i.startswith("COPY") and f"{quality_tier}/ /app/{quality_tier}/" in i for i in stages["cuda"])
    assert not any(quality_tier in i for i in stages["cpu"])


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes; a dir pattern covers its tree."""
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/") or fnmatch.fnmatch(path, pat + "/*"):
            ignored = not negate
    return ignored


def test_dockerignore_lets_in_every_copy_source_and_keeps_the_rest_out() -> None:
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    sources = []
    for stage in dockerfile_stages().values():
        for instr in stage:
            if instr.startswith("COPY") and "--from=" not in instr:
                sources += [s.rstrip("/") for s in instr.split()[1:-1] if not s.startswith("--")]
    assert sources
    for src in sources:
        sample = src if "." in Path(src).name else f"{src}/x.py"
        assert not _ignored(sample, patterns), f"{src} is COPY'd but excluded by {DOCKERIGNORE.name}"
    for heavy in (".venv/bin/python", ".venv-envoy/bin/envoy", ".git/HEAD", "models/detector/work/ckpt.bin",
                  "tests/unit/test_x.py", "bench/results/x.json", "extproc/__pycache__/x.pyc"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the build context"
