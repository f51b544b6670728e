"""RemoteEngine: the Engine protocol over the detection API, against real in-process servers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extproc.api.server import DetectorApiServer
from extproc.config import default_config, parse_config
from extproc.gateway.wiring import build_engine
from extproc.inference.api import InferenceError, ModelUnavailable, Overloaded
from extproc.api.client import RemoteEngine, RemoteSettings, RemoteTimeout, RemoteUnavailable
from extproc.server import ServerOptions
from tests.unit.api.fakes import FakeEngine

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(engine: FakeEngine) -> DetectorApiServer:
    server = DetectorApiServer(engine, ServerOptions.from_config(default_config(), address="127.0.0.1:0", shutdown_grace_s=0.1))
    await server.start()
    return server


def _remote(*endpoints: str, **kw) -> RemoteEngine:  # noqa: ANN003
    """The config's defaults (the only defaults there are) with these endpoints, plus `kw`."""
    cfg = parse_config({"truthlens": {"inference": {"remote": list(endpoints)}}})
    return RemoteEngine(RemoteSettings.from_config(cfg, **kw))


async def test_detect_and_classify_match_the_engine_behind_the_pool() -> None:
    engine = FakeEngine()
    server = await _serve(engine)
    remote = _remote(f"dns:///{server.address}")  # the one-name form a headless Service uses
    try:
        got = await remote.detect(["ctx"], "q?", "It is in Oslo.", frozenset({"context_pmi"}))
        assert got == await engine.detect(["ctx"], "q?", "It is in Oslo.")
        assert engine.seen[-2][3] == frozenset({"context_pmi"})
        assert (await remote.classify_prompt("a fact?", prefiltered=True)).confidence == 0.8
        assert (await remote.classify_prompt("a poem")).by == "prefilter"  # the pool's prefilter still runs
        assert remote.prefilter_prompt("a poem") is None
        assert [c.label for c in await remote.explain(["c"], "abc", [(0, 3)])] == ["neutral"]
    finally:
        await remote.close()
        await server.stop(0.1)


async def test_roles_and_models_come_from_the_pool() -> None:
    server = await _serve(FakeEngine(roles=("detector",)))
    remote = _remote(server.address)
    try:
        assert remote.has("sentinel") and remote.has("detector")  # unknown yet: the standard set
        await remote.start()
        assert not remote.has("sentinel") and remote.has("detector")
        assert [(m.role, m.name) for m in remote.models()] == [("detector", "fake-detector")]
        assert remote.signals == frozenset({"context_pmi"}) and remote.pool_version
        with pytest.raises(ModelUnavailable):
            await remote.classify_prompt("q")
    finally:
        await remote.close()
        await server.stop(0.1)


async def test_retries_on_the_next_endpoint_when_one_is_down() -> None:
    engine = FakeEngine()
    server = await _serve(engine)
    dead = f"127.0.0.1:{free_port()}"
    remote = _remote(dead, server.address, retries=1)
    try:
        for _ in range(4):  # whichever endpoint a call starts at, it is answered
            assert (await remote.detect([], None, "fine")).score == pytest.approx(0.1)
        assert engine.calls == 4
    finally:
        await remote.close()
        await server.stop(0.1)


async def test_round_robin_over_the_endpoints() -> None:
    a, b = FakeEngine(name="a"), FakeEngine(name="b")
    sa, sb = await _serve(a), await _serve(b)
    remote = _remote(sa.address, sb.address)
    try:
        for _ in range(6):
            await remote.detect([], None, "x")
        assert (a.calls, b.calls) == (3, 3)
    finally:
        await remote.close()
        await sa.stop(0.1)
        await sb.stop(0.1)


async def test_pool_down_raises_remote_unavailable_fast() -> None:
    remote = _remote(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", retries=3, deadline_s=5.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteUnavailable) as err:
            await remote.detect([], None, "x")
        assert isinstance(err.value, ModelUnavailable)  # the gateway: unchecked / models_unavailable
        assert not await remote.refresh()
    finally:
        await remote.close()
    assert time.monotonic() - t0 < 3.0  # refused connections fail at once, not at the deadline


async def test_deadline_covers_the_call() -> None:
    server = await _serve(FakeEngine())
    remote = _remote(server.address, deadline_s=0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteTimeout) as err:
            await remote.detect([], None, "SLOW")
        assert isinstance(err.value, TimeoutError) and isinstance(err.value, InferenceError)
    finally:
        await remote.close()
        await server.stop(0.1)
    assert time.monotonic() - t0 < 2.0


async def test_status_codes_map_to_engine_exceptions() -> None:
    a, b = FakeEngine(), FakeEngine()
    sa, sb = await _serve(a), await _serve(b)
    remote = _remote(sa.address, sb.address, retries=1)
    try:
        with pytest.raises(Overloaded):
            await remote.detect([], None, "OVERLOAD")
        assert a.calls + b.calls == 2  # overloaded on one: tried on the other
        with pytest.raises(InferenceError) as err:
            await remote.detect([], None, "ERROR")
        assert type(err.value) is InferenceError and "INTERNAL" in str(err.value)
        assert a.calls + b.calls == 3  # an engine failure is not retried
        with pytest.raises(InferenceError):
            await remote.detect([], None, "INVALID")
    finally:
        await remote.close()
        await sa.stop(0.1)
        await sb.stop(0.1)


def test_config_selects_the_remote_engine_and_loads_no_model() -> None:
    cfg = parse_config({"truthlens": {"inference": {"remote": ["10.0.0.7:50052", "10.0.0.8:50052"], "deadline_ms": 900,
                                                    "retries": 2, "load_balancing": "pick_first"}}})
    engine = build_engine(cfg)
    assert isinstance(engine, RemoteEngine)
    assert engine.settings == RemoteSettings(("10.0.0.7:50052", "10.0.0.8:50052"), deadline_s=0.9, retries=2,
                                             load_balancing="pick_first", max_message_bytes=cfg.server.max_message_bytes)
    assert engine.models() == ()


def test_remote_engine_imports_no_envoy_or_gateway_code() -> None:
    code = ("import sys, extproc.api.client\n"
            "print([m for m in sys.modules if m.split('.')[0] == 'envoy' or m.startswith(('extproc.gateway', "
            "'extproc.server', 'extproc.inference.engine', 'onnxruntime'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
