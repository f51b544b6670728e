"""proto/ compiles with grpcio-tools, and the committed extproc/api/v1 is what it compiles to."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _generator():
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_protos_compile_and_the_committed_code_is_current(tmp_path: Path) -> None:
    gen = _generator()
    files = gen.compile_into(tmp_path)
    assert set(files) == {"detection_pb2.py", "detection_pb2.pyi", "detection_pb2_grpc.py"}
    assert gen.stale() == [], "run: python proto/generate.py"


def test_check_mode_fails_on_a_stale_file(tmp_path: Path) -> None:
    gen = _generator()
    gen.compile_into(tmp_path)
    (tmp_path / "detection_pb2.py").write_text("# edited by hand\n")
    assert gen.stale(tmp_path) == ["detection_pb2.py"]
    ok = subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_generated_code_loads_on_this_runtime_without_grpcio_tools() -> None:
    """The serving path imports only the committed modules (gencode <= the protobuf runtime)."""
    code = ("import sys; sys.modules['grpc_tools'] = None\n"
            "from extproc.api.v1 import detection_pb2, detection_pb2_grpc\n"
            "print(detection_pb2.DESCRIPTOR.services_by_name['Detection'].full_name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "truthlens.v1.Detection"
