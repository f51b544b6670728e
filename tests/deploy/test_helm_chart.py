"""The Helm chart: lints strictly, renders valid Kubernetes objects, and what it renders
(TruthLens config, Envoy config) passes the project's own validators."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    CHART,
    GPU_PREMIUM_VALUES,
    ROOT,
    check_config,
    config_dict,
    container,
    default_config_dict,
    envoy_validate,
    find,
    helm_bin,
    helm_template,
    helm_template_error,
    run,
    validate_object,
    with_tls_dir,
)
from tests.helpers.envoy_yaml import ext_proc_filters

GPU = ("-f", str(GPU_PREMIUM_VALUES))
GATEWAY = ("-f", str(ROOT / "k8s" / "gateway" / "values-envoy-gateway.yaml"))
SIDECAR_TLS = ("--set", "sidecarTLS.enabled=true", "--set", "sidecarTLS.secretName=truthlens-sidecar-tls")
RENDERINGS = {"default": (), "gpu-premium": GPU, "gateway": GATEWAY, "sidecar-tls": SIDECAR_TLS}
CHART_OWNED_KEYS = {("server", "grpc_address"), ("server", "metrics_address")}


def _chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _config_from(objs: list[dict[str, Any]], tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(find(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    return path


def _without(cfg: dict[str, Any], keys: set[tuple[str, str]]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items()}
    for section, key in keys:
        out[section].pop(key)
    return out


@pytest.mark.parametrize("values", [(), GPU, GATEWAY], ids=["default", "gpu-premium", "gateway"])
def test_helm_lint_strict(values: tuple[str, ...]) -> None:
    proc = run([helm_bin(), "lint", "--strict", str(CHART), *values])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("name", RENDERINGS)
def test_every_rendered_object_validates(name: str) -> None:
    objs = helm_template(*RENDERINGS[name])
    assert objs
    for obj in objs:
        validate_object(obj)


def test_default_rendering_has_the_expected_objects() -> None:
    kinds = sorted(o["kind"] for o in helm_template())
    assert kinds == sorted(
        ["ConfigMap", "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget",
         "Service", "ServiceAccount"]  # NetworkPolicy on by default (#19)
    )


def test_chart_config_defaults_equal_the_project_defaults() -> None:
    """values.yaml `config:` cannot drift from the config schema's defaults..."""
    assert _chart_values()["config"] == default_config_dict()


def test_chart_config_defaults_equal_the_documented_example() -> None:
    """...nor from docs/truthlens.example.yaml (whose example decisions are off in the chart)."""
    example = config_dict(ROOT / "docs" / "truthlens.example.yaml")
    chart = _chart_values()["config"]
    assert {k: v for k, v in chart.items() if k != "decisions"} == {k: v for k, v in example.items() if k != "decisions"}
    assert chart["decisions"] == []


def test_default_config_passes_check_config_and_only_listeners_change(tmp_path: Path) -> None:
    path = _config_from(helm_template(), tmp_path)
    proc = check_config(path)
    assert proc.returncode == 0, proc.stderr
    effective = yaml.safe_load(proc.stdout)
    # Envoy is in the pod: the sidecar listens on loopback only (#19); probes exec, Prometheus goes via Envoy
    assert effective["server"]["grpc_address"] == "127.0.0.1:50051"
    assert effective["server"]["metrics_address"] == "127.0.0.1:9464"
    assert _without(effective, CHART_OWNED_KEYS) == _without(default_config_dict(), CHART_OWNED_KEYS)


def test_gpu_premium_config_passes_check_config(tmp_path: Path) -> None:
    path = _config_from(helm_template(*GPU), tmp_path)
    proc = check_config(path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["server"]["grpc_address"] == "unix:/var/run/truthlens/extproc.sock"
    assert cfg["truthlens"]["default_mode"] == "premium"
    assert cfg["truthlens"]["models"]["provider"] == "cuda"
    assert [v["name"] for v in cfg["truthlens"]["modes"]["premium"]["verifiers"]] == ["verifier-a", "verifier-b"]
    assert [d["name"] for d in cfg["decisions"]] == ["medical", "internal-tools"]
    assert cfg["server"]["shutdown_grace_s"] == 20


def test_a_bad_config_value_is_caught_by_check_config(tmp_path: Path) -> None:
    """check-config on the rendered ConfigMap is a real gate, not a formality."""
    objs = helm_template("--set", "config.truthlens.default_mode=turbo")
    proc = check_config(_config_from(objs, tmp_path))
    assert proc.returncode == 1
    assert "truthlens.default_mode" in proc.stderr


@pytest.mark.parametrize("name", ["default", "gpu-premium", "sidecar-tls"])
def test_rendered_envoy_config_validates(name: str, tmp_path: Path, tls_dir: Path) -> None:
    envoy_yaml = find(helm_template(*RENDERINGS[name]), "ConfigMap", "-envoy")["data"]["envoy.yaml"]
    proc = envoy_validate(envoy_yaml, tmp_path, tls_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_pod_shape() -> None:
    objs = helm_template()
    dep = find(objs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["envoy", "truthlens"]
    sidecar = container(dep, "truthlens")
    assert sidecar["image"].endswith(":0.1.0-cpu")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # kubelet cannot dial loopback: exec
        assert sidecar[probe]["exec"]["command"] == ["python", "/usr/local/bin/truthlens-healthcheck"]
    assert {e["name"]: e.get("value") for e in sidecar["env"]}["TRUTHLENS_HEALTH_ADDRESS"] == "127.0.0.1:50051"
    assert "ports" not in sidecar  # nothing of the sidecar is reachable from outside the pod
    # NetworkPolicy on by default: clients and Envoy's ops port only
    netpol = find(objs, "NetworkPolicy")
    assert {p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]} == {8080, 9902}
    # the sidecar's /metrics is scraped through Envoy's ops listener
    envoy_cfg = yaml.safe_load(find(objs, "ConfigMap", "-envoy")["data"]["envoy.yaml"])
    ops = next(lst for lst in envoy_cfg["static_resources"]["listeners"] if lst["name"] == "ops")
    routes = ops["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert {"match": {"path": "/metrics"}, "route": {"cluster": "truthlens_metrics"}} in routes
    assert "metrics" not in {p["name"] for p in find(objs, "Service")["spec"]["ports"]}
    assert "nvidia.com/gpu" not in sidecar["resources"].get("limits", {})
    assert sidecar["resources"]["requests"]["cpu"] == "2"
    assert spec["securityContext"]["runAsNonRoot"] is True
    # SIGTERM drain: preStop sleep + shutdown_grace_s + margin
    assert spec["terminationGracePeriodSeconds"] == 10 + 10 + 5
    envoy = container(dep, "envoy")
    assert envoy["readinessProbe"]["httpGet"]["path"] == "/ready"
    # both ConfigMaps are mounted where the containers read them
    mounts = {m["name"]: m["mountPath"] for c in spec["containers"] for m in c["volumeMounts"]}
    assert mounts["truthlens-config"] == "/etc/truthlens" and "/etc/truthlens/config.yaml" in sidecar["args"]
    assert mounts["envoy-config"] == "/etc/envoy/config" and "/etc/envoy/config/envoy.yaml" in envoy["args"]
    # PDB and HPA target this Deployment's pods
    labels = dep["spec"]["template"]["metadata"]["labels"]
    pdb = find(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = find(objs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert "replicas" not in dep["spec"]  # the HPA owns the replica count
    svc = find(objs, "Service")
    assert svc["spec"]["selector"].items() <= labels.items()


def test_gpu_premium_pod_shape() -> None:
    objs = helm_template(*GPU)
    dep = find(objs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    sidecar = container(dep, "truthlens")
    assert sidecar["image"].endswith(":0.1.0-cuda")
    assert sidecar["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # UDS: both containers share the socket directory; probes go through the socket
    for c in spec["containers"]:
        assert {"name": "extproc-socket", "mountPath": "/var/run/truthlens"} in c["volumeMounts"]
    assert sidecar["readinessProbe"]["exec"]["command"] == ["python", "/usr/local/bin/truthlens-healthcheck"]
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["TRUTHLENS_HEALTH_ADDRESS"] == "unix:/var/run/truthlens/extproc.sock"
    envoy_cfg = yaml.safe_load(find(objs, "ConfigMap", "-envoy")["data"]["envoy.yaml"])
    cluster = next(c for c in envoy_cfg["static_resources"]["clusters"] if c["name"] == "truthlens_extproc")
    assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "pipe": {"path": "/var/run/truthlens/extproc.sock"}
    }
    # TLS listener from the secret, fail-closed tenant
    assert {"name": "envoy-tls", "secret": {"secretName": "truthlens-tls"}} in spec["volumes"]
    listeners = [lst["name"] for lst in envoy_cfg["static_resources"]["listeners"]]
    assert listeners == ["ingress_https", "ingress_http", "ops"]
    hcm = envoy_cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    vhosts = {vh["name"]: vh for vh in hcm["route_config"]["virtual_hosts"]}
    judged = vhosts["fail_closed"]["routes"][0]
    assert judged["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"]["failure_mode_allow"] is False
    assert "clinical-llm.example.com" in vhosts["fail_closed"]["domains"]
    # the verifier keys come from a Secret, never from the ConfigMap
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["VERIFIER_A_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "truthlens-verifiers"
    assert find(objs, "ServiceMonitor")["spec"]["endpoints"][0] == {"port": "envoy-stats", "path": "/metrics",
                                                                     "interval": "30s"}
    # UDS + NetworkPolicy: the pod exposes no ext_proc port and no sidecar metrics port (loopback, via Envoy)
    netpol = find(objs, "NetworkPolicy")
    open_ports = {p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]}
    assert open_ports == {8080, 8443, 9902}
    assert "ports" not in sidecar


def test_gateway_mode_renders_an_extension_policy_and_no_envoy() -> None:
    objs = helm_template(*GATEWAY)
    dep = find(objs, "Deployment")
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["truthlens"]
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-envoy")]
    policy = find(objs, "EnvoyExtensionPolicy")
    svc = find(objs, "Service")
    grpc_port = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    ext = policy["spec"]["extProc"][0]
    assert ext["backendRefs"] == [{"group": "", "kind": "Service", "name": svc["metadata"]["name"], "port": grpc_port["port"]}]
    assert ext["messageTimeout"] == "10s" and ext["failOpen"] is True
    assert policy["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llm-chat-completions"}
    ]
    # the route it targets exists in the example routes; the catch-all route is not targeted
    routes = [d for d in yaml.safe_load_all((ROOT / "k8s" / "gateway" / "httproutes.yaml").read_text()) if d]
    for obj in routes:
        validate_object(obj)
    route_names = {r["metadata"]["name"] for r in routes if r["kind"] == "HTTPRoute"}
    assert route_names == {"llm-chat-completions", "llm-other"}
    # only Envoy Gateway's namespace may call the sidecar's gRPC port
    grpc_rule = [r for r in find(objs, "NetworkPolicy")["spec"]["ingress"] if "from" in r]
    assert grpc_rule == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}}}],
        "ports": [{"port": grpc_port["port"], "protocol": "TCP"}],
    }]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "sidecar.transport=grpc"), "sidecar.transport"),
        (("--set", "envoy.enabled=false", "--set", "sidecar.transport=uds"), "needs envoy.enabled"),
        (("--set", "tls.enabled=true"), "tls.secretName"),
        (("--set", "gatewayAPI.extensionPolicy.enabled=true"), "envoy.enabled=false"),
        (("--set", "sidecarTLS.enabled=true"), "sidecarTLS.secretName"),
        (("--set", "gpu.enable=true"), "gpu: Additional property enable is not allowed"),  # values.schema.json
        (("--set", "envoy.messageTimeout=10"), "envoy.messageTimeout"),
    ],
    ids=["bad-transport", "uds-without-envoy", "tls-without-secret", "policy-with-envoy", "sidecar-tls-without-secret",
         "misspelled-value", "duration-without-unit"],
)
def test_bad_values_fail_with_the_key_named(args: tuple[str, ...], message: str) -> None:
    assert message in helm_template_error(*args)


def test_sidecar_tls_wires_server_envoy_and_probes(tmp_path: Path, tls_dir: Path) -> None:
    objs = helm_template(*SIDECAR_TLS)
    rendered = yaml.safe_load(find(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    assert rendered["server"]["tls"] == {
        "enabled": True, "cert_file": "/etc/truthlens-tls/tls.crt", "key_file": "/etc/truthlens-tls/tls.key",
        "client_ca_file": "/etc/truthlens-tls/ca.crt",
    }
    # check-config insists the files exist: point the mount path at real ones
    path = _config_from(objs, tmp_path)
    path.write_text(with_tls_dir(path.read_text(), tls_dir))
    proc = check_config(path)
    assert proc.returncode == 0, proc.stderr
    dep = find(objs, "Deployment")
    sidecar, envoy = container(dep, "truthlens"), container(dep, "envoy")
    assert "exec" in sidecar["livenessProbe"]  # kubelet's grpc probe cannot do TLS
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["TRUTHLENS_HEALTH_TLS_CA"] == "/etc/truthlens-tls/ca.crt" and env["TRUTHLENS_HEALTH_TLS_SERVER_NAME"] == "localhost"
    for c in (sidecar, envoy):
        assert {"name": "sidecar-tls", "mountPath": "/etc/truthlens-tls", "readOnly": True} in c["volumeMounts"]
    envoy_cfg = yaml.safe_load(find(objs, "ConfigMap", "-envoy")["data"]["envoy.yaml"])
    cluster = next(c for c in envoy_cfg["static_resources"]["clusters"] if c["name"] == "truthlens_extproc")
    tls = cluster["transport_socket"]["typed_config"]
    assert tls["sni"] == "localhost"
    assert tls["common_tls_context"]["tls_certificates"][0]["certificate_chain"] == {"filename": "/etc/truthlens-tls/tls.crt"}


def test_fail_open_toggle_reaches_envoy() -> None:
    envoy_cfg = yaml.safe_load(
        find(helm_template("--set", "envoy.failureModeAllow=false"), "ConfigMap", "-envoy")["data"]["envoy.yaml"]
    )
    hcm = envoy_cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]
    assert ext["failure_mode_allow"] is False
    assert ext["status_on_error"] == {"code": "ServiceUnavailable"}


def _nullable_with_default(cls: type, prefix: str = "") -> set[str]:
    """Schema mapping keys typed `X | None` whose default is not None (lists keep nulls in Helm)."""
    import dataclasses
    import types
    import typing

    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, path = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            out |= _nullable_with_default(hint, path + ".")
        elif isinstance(hint, types.UnionType) and type(None) in hint.__args__:
            default = f.default if f.default is not dataclasses.MISSING else None
            if default is not None:
                out.add(path)
    return out


def test_nullable_key_list_matches_the_schema() -> None:
    from extproc.config.schema import Config

    text = (CHART / "templates" / "_helpers.tpl").read_text()
    block = text.split('define "truthlens.nullableConfigKeys" -}}', 1)[1].split("{{-", 1)[0]
    assert set(block.split()) == _nullable_with_default(Config)


def test_a_key_set_to_null_stays_null(tmp_path: Path) -> None:
    """Helm deletes null-valued keys; the chart must not let the default come back."""
    values = tmp_path / "values.yaml"
    values.write_text("config:\n  truthlens:\n    rag_context_field: null\n    models: {sentinel: null, explainer: null}\n")
    proc = check_config(_config_from(helm_template("-f", str(values)), tmp_path))
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)["truthlens"]
    assert cfg["models"]["sentinel"] is None and cfg["models"]["explainer"] is None
    assert cfg["models"]["detector"] == "auto"
    assert cfg["rag_context_field"] is None


@pytest.mark.parametrize("name", ["default", "gpu-premium"])
def test_sidecar_asks_envoy_for_at_most_what_envoy_allows(name: str) -> None:
    """The chart sets server.envoy_max_message_timeout_s from envoy.maxMessageTimeout (90s with gpu-premium)."""
    objs = helm_template(*RENDERINGS[name])
    cfg = yaml.safe_load(find(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    envoy = yaml.safe_load(find(objs, "ConfigMap", "-envoy")["data"]["envoy.yaml"])
    caps = {f["max_message_timeout"] for f in ext_proc_filters(envoy)}
    assert caps == {f"{cfg['server']['envoy_max_message_timeout_s']:g}s"}


def test_listen_on_pod_ip_brings_back_grpc_probes_and_direct_metrics(tmp_path: Path) -> None:
    objs = helm_template("--set", "sidecar.listenOnPodIP=true")
    cfg = yaml.safe_load(check_config(_config_from(objs, tmp_path)).stdout)
    assert (cfg["server"]["grpc_address"], cfg["server"]["metrics_address"]) == ("0.0.0.0:50051", "0.0.0.0:9464")
    sidecar = container(find(objs, "Deployment"), "truthlens")
    assert sidecar["readinessProbe"]["grpc"] == {"port": 50051}
    netpol = find(objs, "NetworkPolicy")
    assert 9464 in {p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]}
    assert 50051 not in {p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]}


def test_gateway_mode_listens_on_the_pod_ip(tmp_path: Path) -> None:
    cfg = yaml.safe_load(check_config(_config_from(helm_template(*GATEWAY), tmp_path)).stdout)
    assert cfg["server"]["grpc_address"] == "0.0.0.0:50051"



def test_gateway_routes_send_every_chat_spelling_to_the_sidecar() -> None:
    """#19 in gateway mode: odd spellings of the chat path (case, %-escapes, ;params) reach the sidecar."""
    routes = {d["metadata"]["name"]: d for d in yaml.safe_load_all((ROOT / "k8s" / "gateway" / "httproutes.yaml").read_text())
              if d and d["kind"] == "HTTPRoute"}
    chat = routes["llm-chat-completions"]["spec"]["rules"][0]["matches"]
    assert {"path": {"type": "RegularExpression", "value": "/(?i:.*(completions|%).*)"}} in chat
