"""The chart's optional remote detector pool (detectorPool.enabled): lints, renders valid objects,
and the sidecars' config points at the pool's headless Service."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.support import (
    CHART,
    check_config,
    container,
    find,
    helm_bin,
    helm_template,
    helm_template_error,
    run,
    validate_object,
)

POOL = ("--set", "detectorPool.enabled=true")
POOL_ALL = (*POOL, "--set", "networkPolicy.enabled=true", "--set", "detectorPool.gpu=true")


def _deployment(objs: list[dict], pool: bool) -> dict:
    hits = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-detector") == pool]
    assert len(hits) == 1
    return hits[0]


def test_chart_lints_with_the_pool() -> None:
    proc = run([helm_bin(), "lint", "--strict", str(CHART), *POOL_ALL])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pool_objects_validate_and_are_off_by_default() -> None:
    assert not [o for o in helm_template() if o["metadata"]["name"].endswith("-detector")]
    objs = helm_template(*POOL_ALL)
    for obj in objs:
        validate_object(obj)
    names = sorted((o["kind"], o["metadata"]["name"]) for o in objs if o["metadata"]["name"].endswith("-detector"))
    assert names == [("Deployment", "truthlens-detector"), ("NetworkPolicy", "truthlens-detector"),
                     ("Service", "truthlens-detector")]


def test_sidecar_config_points_at_the_pool_service(tmp_path: Path) -> None:
    objs = helm_template(*POOL)
    service = find(objs, "Service", "-detector")
    assert service["spec"]["clusterIP"] == "None"  # headless: the sidecars round-robin over every pod
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    config = find(objs, "ConfigMap", "truthlens-config")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(config)
    proc = check_config(path)
    assert proc.returncode == 0, proc.stderr
    effective = yaml.safe_load(proc.stdout)
    assert effective["truthlens"]["inference"]["remote"] == [
        f"dns:///{service['metadata']['name']}.default.svc.cluster.local:{grpc_port}"]

    pool = _deployment(objs, pool=True)
    detector = container(pool, "detector")
    assert detector["args"][:2] == ["serve", "--detector-api"]
    assert f"0.0.0.0:{grpc_port}" in detector["args"]
    assert detector["readinessProbe"]["grpc"]["port"] == grpc_port
    pool_labels = pool["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pool_labels.items()
    # the sidecar's Service (and so its PDB, HPA target, policy) never selects pool pods, nor the reverse
    sidecar_service = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "truthlens")
    assert not sidecar_service["spec"]["selector"].items() <= pool_labels.items()
    sidecar_labels = _deployment(objs, pool=False)["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= sidecar_labels.items()


def test_gpu_pool_and_explicit_remote() -> None:
    objs = helm_template(*POOL_ALL, "--set", "config.truthlens.inference.remote[0]=pool.example:50052")
    detector = container(_deployment(objs, pool=True), "detector")
    assert detector["image"].endswith("-cuda") and detector["resources"]["limits"]["nvidia.com/gpu"] == 1
    sidecar = container(_deployment(objs, pool=False), "truthlens")
    assert sidecar["image"].endswith("-cpu") and "nvidia.com/gpu" not in sidecar["resources"]["limits"]
    config = yaml.safe_load(find(objs, "ConfigMap", "truthlens-config")["data"]["config.yaml"])
    assert config["truthlens"]["inference"]["remote"] == ["pool.example:50052"]  # the user's endpoints win


def test_pool_refuses_sidecar_tls() -> None:
    err = helm_template_error(*POOL, "--set", "sidecarTLS.enabled=true", "--set", "sidecarTLS.secretName=s")
    assert "detectorPool.enabled: not with sidecarTLS.enabled" in err
