from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.support import make_tls_dir


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tls_dir(tmp_path_factory.mktemp("tls"))
