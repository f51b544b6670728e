"""Plain manifests (k8s/manifests, k8s/gateway) are the chart's rendering, kept current, and
valid; the plain Envoy ConfigMap is envoy/production.yaml verbatim."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import ROOT, container, find, helm_bin, run, validate_object

RENDERED = [
    "k8s/manifests/truthlens.yaml",
    "k8s/manifests/truthlens-gpu.yaml",
    "k8s/manifests/servicemonitor.yaml",
    "k8s/gateway/truthlens-envoy-gateway.yaml",
]


def _objs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


def test_committed_manifests_match_the_chart(tmp_path: Path) -> None:
    proc = run(["bash", str(ROOT / "k8s/tools/render-manifests.sh"), str(tmp_path)], env={**os.environ, "HELM": helm_bin()})
    assert proc.returncode == 0, proc.stderr
    for rel in RENDERED:
        assert (tmp_path / rel).read_text() == (ROOT / rel).read_text(), (
            f"{rel} is stale: run k8s/tools/render-manifests.sh and commit the result"
        )


@pytest.mark.parametrize("rel", RENDERED)
def test_manifest_objects_validate(rel: str) -> None:
    objs = _objs(rel)
    assert objs
    for obj in objs:
        validate_object(obj)


def test_plain_envoy_configmap_is_the_production_config() -> None:
    for rel in RENDERED[:2]:
        cm = find(_objs(rel), "ConfigMap", "-envoy")
        assert cm["data"]["envoy.yaml"] == (ROOT / "envoy" / "production.yaml").read_text()


def test_plain_manifests_have_no_helm_bookkeeping() -> None:
    for rel in RENDERED:
        text = (ROOT / rel).read_text()
        assert "helm.sh/chart" not in text and "managed-by: Helm" not in text


def test_servicemonitor_is_separate_and_selects_the_service() -> None:
    """Applying the main manifest must not need the Prometheus Operator CRDs."""
    main = _objs(RENDERED[0])
    assert "ServiceMonitor" not in {o["kind"] for o in main}
    (monitor,) = _objs(RENDERED[2])
    svc = find(main, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names


def test_gpu_variant_differs_only_where_it_should() -> None:
    cpu, gpu = (find(_objs(rel), "Deployment") for rel in RENDERED[:2])
    assert "nvidia.com/gpu" not in str(cpu)
    assert container(gpu, "truthlens")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container(gpu, "truthlens")["image"].endswith("-cuda")
    assert container(cpu, "envoy") == container(gpu, "envoy")
