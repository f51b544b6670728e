"""Standard and premium modes: what happens to a buffered JSON answer that was flagged.

Both run only on a finished check that detected a hallucination (`Verdict.actionable`), only
for buffered JSON (a streamed answer has already reached the client), and only on the worst
flagged choice. Whatever fails here (timeouts, HTTP errors, unparsable replies) leaves the
lightweight verdict and the original answer in place, with a log line: mitigation can make an
answer better, never make the request fail.

standard (self-refinement with the same LLM)
    Re-ask the upstream at `truthlens.modes.standard.upstream_url` with the original messages,
    the flagged answer, and a user turn listing the unsupported spans and the grounding
    passages, asking for a corrected answer that uses only the passages. The caller's
    `authorization` / `api-key` headers are forwarded (it is the caller's LLM). The new answer
    is re-detected; repeat up to `max_iterations` refinements or until it is below the
    threshold. The answer in the response body is replaced by the last refinement;
    X-TruthLens-Iterations counts detector passes (1 + refinements) and the verdict describes
    the final answer.

premium (cross-check with other models)
    Ask every configured verifier (OpenAI-compatible `base_url`, `model`, key from the env var
    named by `api_key_env`) the user's question with the grounding passages, then run the
    detector on the ORIGINAL answer with the verifiers' answers as the context. A flagged span
    is kept only if it is also flagged against the verifiers' answers (the verifiers do not
    support it either): agreement confirms it, disagreement drops it as a likely false alarm.
    The score becomes the lower of the two detections. The answer text is not changed; the
    decision's action then applies to the confirmed verdict. Iterations = 2 detector passes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any

import httpx

from extproc.config import Config, mitigation_budget_s
from extproc.gateway.context import RequestContext
from extproc.inference.api import DetectionResult, Engine, Span
from extproc.policy.verdict import Verdict
from extproc.protocol.openai import ProtocolError, dump_json, parse_chat_response
from extproc.telemetry.tracing import stage

log = logging.getLogger("truthlens.mitigation")

# Finish this long before the time asked of Envoy runs out, so the reply (not Envoy's timer) ends the message.
DEADLINE_MARGIN_S = 1.0
FORWARDED_AUTH_HEADERS = ("authorization", "api-key", "openai-organization", "openai-project")
REFINE_INSTRUCTION = (
    "Some statements in your previous answer are not supported by the provided context:\n{spans}\n\n"
    "Context:\n{context}\n\n"
    "Rewrite your answer to the original question using only information supported by the context. "
    "If the context does not contain the information, say so. Reply with the corrected answer only."
)
VERIFY_INSTRUCTION = "Answer the question using only the context below.\n\nContext:\n{context}\n\nQuestion: {question}"


def _passages(context: tuple[str, ...]) -> str:
    return "\n\n".join(f"[{i + 1}] {p}" for i, p in enumerate(context))


def _overlaps(a: Span, spans: tuple[Span, ...]) -> bool:
    return any(a.start < b.end and b.start < a.end for b in spans)


class Mitigator:
    """One per sidecar: an HTTP client pool and the mode settings."""

    def __init__(self, cfg: Config, engine: Engine, client: httpx.AsyncClient | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.standard = cfg.truthlens.modes.standard
        self.premium = cfg.truthlens.modes.premium
        self.detect_timeout_s = cfg.truthlens.inference_timeout_ms / 1000.0
        self.client = client or httpx.AsyncClient(limits=httpx.Limits(max_connections=64))

    def budget_s(self, mode: str) -> float:
        """How long one mitigation may take: the sidecar asks Envoy for this much message time, capped
        at server.envoy_max_message_timeout_s (Envoy's max_message_timeout: it ignores larger requests)."""
        return min(mitigation_budget_s(self.cfg, mode), self.cfg.server.envoy_max_message_timeout_s)

    async def mitigate(self, ctx: RequestContext, body: bytes, verdict: Verdict) -> tuple[Verdict, bytes | None]:
        """(final verdict, replacement body or None). Never raises: failures keep the verdict."""
        t0 = time.perf_counter()
        try:
            with stage("refine" if ctx.decision.mode == "standard" else "cross_check", mode=ctx.decision.mode):
                deadline = max(self.budget_s(ctx.decision.mode) - DEADLINE_MARGIN_S, DEADLINE_MARGIN_S)
                result = await asyncio.wait_for(self._run(ctx, body, verdict), deadline)
        except Exception as exc:  # noqa: BLE001 - mitigation is best effort by design
            log.warning("request %s: %s mode failed (%r); keeping the lightweight verdict",
                        ctx.request_id, ctx.decision.mode, exc)
            result = verdict, None
        ctx.mark("mitigate", t0)
        final, new_body = result
        return replace(final, latency_ms=ctx.spent_ms), new_body

    async def _run(self, ctx: RequestContext, body: bytes, verdict: Verdict) -> tuple[Verdict, bytes | None]:
        if ctx.decision.mode == "standard":
            return await self._refine(ctx, body, verdict)
        if ctx.decision.mode == "premium":
            return await self._cross_check(ctx, verdict), None
        return verdict, None

    # ---- standard ---------------------------------------------------------------------------

    async def _refine(self, ctx: RequestContext, body: bytes, verdict: Verdict) -> tuple[Verdict, bytes | None]:
        if ctx.request_body is None:
            return verdict, None
        request = json.loads(ctx.request_body)
        response = json.loads(body)
        pos = max(ctx.choice_results, key=lambda i: ctx.choice_results[i].score)
        choice = response["choices"][pos]
        answer = ctx.answers[pos] or ""
        result = ctx.choice_results[pos]
        passes = 1
        for _ in range(self.standard.max_iterations):
            spans = "\n".join(f"- {s.text}" for s in result.spans) or "- (the answer as a whole)"
            messages = list(request["messages"]) + [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": REFINE_INSTRUCTION.format(spans=spans, context=_passages(ctx.grounding))},
            ]
            refined = await self._ask(self.standard.upstream_url, request.get("model"), messages,
                                      self._caller_auth(ctx), self.standard.timeout_ms)
            if refined is None:
                break
            answer = refined
            result = await asyncio.wait_for(self.engine.detect(ctx.grounding, ctx.question, answer, ctx.decision.signals),
                                            self.detect_timeout_s)
            passes += 1
            if result.score < ctx.decision.threshold:
                break
        if passes == 1:
            return verdict, None
        choice["message"]["content"] = answer
        ctx.choice_results[pos] = result
        return Verdict.checked(ctx.decision, result, iterations=passes), dump_json(response)

    def _caller_auth(self, ctx: RequestContext) -> dict[str, str]:
        return {k: v for k, v in ctx.request_headers.items() if k in FORWARDED_AUTH_HEADERS}

    async def _ask(self, base_url: str, model: Any, messages: list[dict[str, Any]], headers: dict[str, str],
                   timeout_ms: int) -> str | None:
        url = base_url.rstrip("/") + ("/chat/completions" if base_url.rstrip("/").endswith("/v1")
                                      else "/v1/chat/completions")
        payload = {"model": model, "messages": messages, "stream": False}
        r = await self.client.post(url, json=payload, headers={**headers, "accept-encoding": "identity"},
                                   timeout=timeout_ms / 1000.0)
        if r.status_code // 100 != 2:
            log.warning("mitigation upstream %s answered %d", url, r.status_code)
            return None
        try:
            answers = parse_chat_response(r.content).answers
        except ProtocolError as exc:
            log.warning("mitigation upstream %s: %s", url, exc)
            return None
        return answers[0] if answers and answers[0] else None

    # ---- premium ----------------------------------------------------------------------------

    async def _cross_check(self, ctx: RequestContext, verdict: Verdict) -> Verdict:
        verifiers = self.premium.verifiers
        if not verifiers or not ctx.question:
            return verdict
        prompt = VERIFY_INSTRUCTION.format(context=_passages(ctx.grounding), question=ctx.question)

        async def one(v: Any) -> str | None:
            key = os.environ.get(v.api_key_env) if v.api_key_env else None
            headers = {"authorization": f"Bearer {key}"} if key else {}
            try:
                return await self._ask(v.base_url, v.model, [{"role": "user", "content": prompt}], headers,
                                       self.premium.timeout_ms)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("verifier %s failed: %r", v.name, exc)
                return None

        answers = [a for a in await asyncio.gather(*(one(v) for v in verifiers)) if a]
        if not answers:
            return verdict
        pos = max(ctx.choice_results, key=lambda i: ctx.choice_results[i].score)
        original = ctx.choice_results[pos]
        answer_spans = original.spans
        # the same answer, judged against what the verifiers said instead of the documents
        answer_text = ctx.answers[pos] or ""
        against = await asyncio.wait_for(self.engine.detect(tuple(answers), ctx.question, answer_text),
                                         self.detect_timeout_s)
        confirmed = tuple(s for s in answer_spans if _overlaps(s, against.spans))
        result = DetectionResult(score=min(original.score, against.score), spans=confirmed,
                                 latency_ms=original.latency_ms + against.latency_ms)
        ctx.choice_results[pos] = result
        return Verdict.checked(ctx.decision, result, iterations=2)

    async def close(self) -> None:
        await self.client.aclose()
