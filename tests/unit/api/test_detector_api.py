"""The detection API server (real grpc.aio, in-process) over a test engine and over the real OnnxEngine."""

from __future__ import annotations

from typing import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.api import convert
from extproc.api.server import SERVICE, DetectorApiServer
from extproc.api.v1 import detection_pb2 as pb
from extproc.api.v1 import detection_pb2_grpc as pb_grpc
from extproc.config import default_config
from extproc.server import ServerOptions
from tests.unit.api.fakes import FakeEngine


async def _serve(engine) -> DetectorApiServer:  # noqa: ANN001
    server = DetectorApiServer(engine, ServerOptions.from_config(default_config(), address="127.0.0.1:0", shutdown_grace_s=0.5))
    await server.start()
    return server


@pytest.fixture
async def api() -> AsyncIterator[tuple[pb_grpc.DetectionStub, FakeEngine, grpc.aio.Channel]]:
    engine = FakeEngine()
    server = await _serve(engine)
    channel = grpc.aio.insecure_channel(server.address)
    try:
        yield pb_grpc.DetectionStub(channel), engine, channel
    finally:
        await channel.close()
        await server.stop(0.1)


async def test_detect_round_trips_every_field(api) -> None:
    stub, engine, _ = api
    req = convert.detect_request(["Paris is in France."], "Where is Paris?", "Paris is in Oslo.", frozenset({"context_pmi"}))
    got = convert.detection_from_proto(await stub.Detect(req, timeout=5))
    assert got == await engine.detect(["Paris is in France."], "Where is Paris?", "Paris is in Oslo.")
    assert got.spans[0].nli_label == "contradiction" and got.spans[1].nli_label is None and got.spans[1].severity is None
    # absent question / signals stay absent (None = every signal), an empty signal set stays empty
    await stub.Detect(convert.detect_request([], None, "x", None), timeout=5)
    await stub.Detect(convert.detect_request([], None, "y", frozenset()), timeout=5)
    assert engine.seen[-2][1:] == (None, "x", None) and engine.seen[-1][3] == frozenset()


async def test_classify_prompt_applies_the_prefilter_unless_skipped(api) -> None:
    stub, _, _ = api
    quick = await stub.ClassifyPrompt(pb.ClassifyPromptRequest(prompt="write a poem"), timeout=5)
    assert (quick.needs_check, quick.decided_by) == (False, "prefilter")
    model = await stub.ClassifyPrompt(pb.ClassifyPromptRequest(prompt="write a poem", skip_prefilter=True), timeout=5)
    assert (model.needs_check, model.confidence, model.decided_by) == (True, 0.8, "model")


async def test_explain_and_info_and_health(api) -> None:
    stub, _, channel = api
    reply = await stub.Explain(pb.ExplainRequest(context=["c"], answer="abc def", ranges=[pb.TextRange(start=4, end=7)]))
    assert [(c.start, c.end, c.sentence, c.label) for c in reply.claims] == [(4, 7, "def", "neutral")]
    info = await stub.GetInfo(pb.GetInfoRequest(), timeout=5)
    assert info.version and {m.role for m in info.models} == {"sentinel", "detector", "explainer"}
    assert list(info.signals) == ["context_pmi"]
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE):
        status = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert status.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(("answer", "code"), [
    ("OVERLOAD", grpc.StatusCode.RESOURCE_EXHAUSTED), ("ERROR", grpc.StatusCode.INTERNAL),
    ("CRASH", grpc.StatusCode.INTERNAL), ("INVALID", grpc.StatusCode.INVALID_ARGUMENT),
])
async def test_engine_errors_become_status_codes(api, answer: str, code: grpc.StatusCode) -> None:
    stub, _, _ = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Detect(pb.DetectRequest(answer=answer), timeout=5)
    assert err.value.code() == code


async def test_missing_model_is_failed_precondition() -> None:
    server = await _serve(FakeEngine(roles=("detector",)))
    async with grpc.aio.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.DetectionStub(channel).ClassifyPrompt(pb.ClassifyPromptRequest(prompt="q"), timeout=5)
    await server.stop(0.1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "sentinel" in err.value.details()


async def test_shutdown_turns_health_not_serving_first() -> None:
    server = await _serve(FakeEngine())
    await server.health.enter_graceful_shutdown()
    async with grpc.aio.insecure_channel(server.address) as channel:
        status = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE))
    await server.stop(0.1)
    assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_real_onnx_engine_served(tiny_models) -> None:  # noqa: ANN001
    """The tiny random models behind the API: offsets index the answer, Explain judges each sentence."""
    from extproc.inference.engine import build_engine
    from tests.helpers.settings import engine_settings

    engine = build_engine(engine_settings(detector_dir=str(tiny_models["bert-token"]),
                                          explainer_dir=str(tiny_models["bert-nli"]), provider="cpu", max_wait_ms=1.0))
    server = await _serve(engine)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.DetectionStub(channel)
            answer = "The tower was built in 1889. It is in Paris."
            ctx = ["The eiffel tower was built in 1889 in paris france."]
            got = convert.detection_from_proto(await stub.Detect(convert.detect_request(ctx, "when?", answer, None)))
            direct = await engine.detect(ctx, "when?", answer)
            assert got.score == pytest.approx(direct.score) and got.signals == direct.signals
            assert [(s.start, s.end, s.text) for s in got.spans] == [(s.start, s.end, s.text) for s in direct.spans]
            for s in got.spans:
                assert answer[s.start:s.end] == s.text
            claims = (await stub.Explain(pb.ExplainRequest(context=ctx, answer=answer))).claims
            assert [c.sentence for c in claims] == ["The tower was built in 1889.", "It is in Paris."]
            assert all(c.label in ("entailment", "neutral", "contradiction") for c in claims)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Explain(pb.ExplainRequest(context=[], answer=answer))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ClassifyPrompt(pb.ClassifyPromptRequest(prompt="q"))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # no sentinel loaded
    finally:
        await server.stop(0.1)
        await engine.close()
