"""The ConfigMap the chart renders (UDS transport) starts the real sidecar: the probe script the
pod uses sees SERVING over the socket, /metrics answers, SIGTERM ends it cleanly.
Models are nulled so the test does not depend on the bundled models being present; loopback
only (the metrics listener the chart binds to 0.0.0.0 is moved to 127.0.0.1 by the serve flag)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.support import ROOT, container, find, helm_template, run, with_tls_dir

pytestmark = pytest.mark.e2e
PROBE = ROOT / "k8s" / "docker" / "healthcheck.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mtls", [False, True], ids=["plaintext", "mtls"])
def test_chart_uds_config_serves_health_and_metrics(mtls: bool, tmp_path: Path, tls_dir: Path) -> None:
    sock = tmp_path / "extproc.sock"
    values = tmp_path / "values.yaml"
    values.write_text(
        "sidecar: {transport: uds, socketPath: " + str(sock) + "}\n"
        f"sidecarTLS: {{enabled: {str(mtls).lower()}, secretName: sidecar-tls}}\n"
        "config:\n  server: {shutdown_grace_s: 2}\n"
        "  truthlens:\n    models: {sentinel: null, detector: null, explainer: null}\n"
    )
    objs = helm_template("-f", str(values))
    config = tmp_path / "config.yaml"
    config.write_text(with_tls_dir(find(objs, "ConfigMap", "-config")["data"]["config.yaml"], tls_dir))
    # the probe runs with the environment the chart gives the container
    env_vars = {e["name"]: with_tls_dir(e["value"], tls_dir)
                for e in container(find(objs, "Deployment"), "truthlens")["env"] if "value" in e}
    probe_cmd = [sys.executable, str(PROBE)]
    metrics_port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "extproc.cli", "serve", "--config", str(config),
         "--metrics-address", f"127.0.0.1:{metrics_port}"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            probe = run(probe_cmd, env=env_vars)
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, f"never SERVING: {probe.stderr}\n{(tmp_path / 'serve.log').read_text()}"
            time.sleep(0.3)
        assert probe.stdout.strip() == f"unix:{sock}: SERVING"
        if mtls:  # the server really demands TLS and a client certificate
            plain = run(probe_cmd, env={"TRUTHLENS_HEALTH_ADDRESS": env_vars["TRUTHLENS_HEALTH_ADDRESS"]})
            assert plain.returncode == 1
            no_client_cert = {k: v for k, v in env_vars.items() if k not in ("TRUTHLENS_HEALTH_TLS_CERT", "TRUTHLENS_HEALTH_TLS_KEY")}
            assert run(probe_cmd, env=no_client_cert).returncode == 1
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert metrics.status_code == 200 and "truthlens_" in metrics.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
