"""k8s/tools/install-helm.sh: idempotent, and installs the helm version it pins."""

from __future__ import annotations

import os
import re

from tests.deploy.support import ROOT, helm_bin, run

SCRIPT = ROOT / "k8s" / "tools" / "install-helm.sh"


def test_installed_helm_is_the_pinned_version() -> None:
    pinned = re.search(r'^HELM_VERSION="(v[0-9.]+)"', SCRIPT.read_text(), re.M)
    assert pinned
    proc = run([helm_bin(), "version", "--template", "{{.Version}}"])
    assert proc.stdout.strip() == pinned.group(1)


def test_second_run_is_a_no_op() -> None:
    helm = helm_bin()
    before = os.stat(helm).st_mtime_ns
    proc = run(["bash", str(SCRIPT), helm], env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # nothing downloaded, nothing said
    assert os.stat(helm).st_mtime_ns == before
