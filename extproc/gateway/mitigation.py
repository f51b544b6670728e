"""Standard and premium modes: what happens to a buffered JSON answer that was flagged.

Both run only on a finished check that detected a hallucination (`Verdict.actionable`), only
for buffered JSON (a streamed answer has already reached the client: streams get the
lightweight verdict), and only on the worst flagged choice. Whatever fails here (timeouts, HTTP
errors, unparsable replies) leaves the original answer in place and says so in the verdict
(headers, metrics), not only in the log: mitigation can make an answer better, never make the
request fail, and never replace it silently.

standard (self-refinement with the same LLM)
    Re-ask the upstream at `truthlens.modes.standard.upstream_url` with the original messages,
    the best answer so far, and a user turn listing its unsupported spans and the grounding
    passages, asking for a corrected answer that uses only the passages. The caller's
    `authorization` / `api-key` headers are forwarded (it is the caller's LLM). A rewrite
    replaces the best answer only when `policy.refinement.rewrite_problem` finds nothing wrong
    with it (refusal, meta-text, artefacts, off-topic) AND, re-detected, it scores strictly lower.
    Repeat while each rewrite is taken and still at or above the threshold, up to
    `max_iterations`; the first rewrite that is not taken (or a failed re-ask) ends the loop.
    X-TruthLens-Iterations counts detector passes (1 + rewrites checked); x-truthlens-refined says
    whether the answer was replaced, x-truthlens-original-score what it scored before, and
    x-truthlens-refine-rejected why rewrites were not taken.

premium (cross-check with other models)
    Ask every configured verifier (OpenAI-compatible `base_url`, `model`, key from the env var
    named by `api_key_env`) the user's question with the grounding passages, then run the
    detector on the ORIGINAL answer with the verifiers' answers as the context. A flagged span
    is kept only if it is also flagged against the verifiers' answers (the verifiers do not
    support it either): agreement confirms it, disagreement drops it as a likely false alarm.
    The score becomes the lower of the two detections; with no confirmed span it is also held
    just under the threshold, so `detected` is true only with at least one confirmed span
    (`policy.verdict.cross_check_score`). The answer text is not changed; the decision's action
    then applies to the confirmed verdict. Iterations = 2 detector passes. x-truthlens-verifiers
    says how many verifiers answered of those asked (a dead one shows there and in
    truthlens_verifier_calls_total); with none answering the first verdict stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from extproc.config import Config, mitigation_budget_s, mode_users
from extproc.gateway.context import RequestContext
from extproc.inference.api import DetectionResult, Engine, Span
from extproc.policy.refinement import ACCEPTED, NOT_BETTER, UPSTREAM_ERROR, better, rewrite_problem
from extproc.policy.verdict import Verdict, cross_check_score
from extproc.protocol.openai import ProtocolError, dump_json, parse_chat_response
from extproc.telemetry.tracing import stage

log = logging.getLogger("truthlens.mitigation")

# Finish this long before the time asked of Envoy runs out, so the reply (not Envoy's timer) ends the message.
DEADLINE_MARGIN_S = 1.0
PROBE_TIMEOUT_S = 2.0  # startup reachability check of the LLMs standard/premium call
FORWARDED_AUTH_HEADERS = ("authorization", "api-key", "openai-organization", "openai-project")
REFINE_INSTRUCTION = (
    "Some statements in your previous answer are not supported by the provided context:\n{spans}\n\n"
    "Context:\n{context}\n\n"
    "Rewrite your answer to the original question using only information supported by the context: "
    "keep what the context supports, drop what it does not. Reply with the answer itself only, "
    "without mentioning the context, your previous answer or these instructions."
)
VERIFY_INSTRUCTION = "Answer the question using only the context below.\n\nContext:\n{context}\n\nQuestion: {question}"


def _passages(context: tuple[str, ...]) -> str:
    return "\n\n".join(f"[{i + 1}] {p}" for i, p in enumerate(context))


def _overlaps(a: Span, spans: tuple[Span, ...]) -> bool:
    return any(a.start < b.end and b.start < a.end for b in spans)


async def probe_llms(cfg: Config, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """One warning per LLM the modes in use will call (standard's upstream_url, premium's verifiers) that
    does not accept a TCP connection within `timeout_s`, naming its key. `truthlens serve` logs them at
    startup; it does not refuse to start, since an LLM can be briefly down at deploy time and a sidecar
    crash loop would leave every request unjudged. At run time the same failure shows per request
    (x-truthlens-refine-rejected: upstream_error, x-truthlens-verifiers) and in the metrics."""
    targets: list[tuple[str, str, str]] = []
    modes = cfg.truthlens.modes
    if mode_users(cfg, "standard") and modes.standard.upstream_url:
        targets.append(("truthlens.modes.standard.upstream_url", modes.standard.upstream_url,
                        "standard mode keeps every original answer (x-truthlens-refined: false)"))
    if mode_users(cfg, "premium"):
        targets += [(f"truthlens.modes.premium.verifiers[{i}].base_url", v.base_url,
                     f"premium mode goes on without verifier {v.name!r} (x-truthlens-verifiers)")
                    for i, v in enumerate(modes.premium.verifiers)]

    async def one(key: str, url: str, effect: str) -> str | None:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout_s)
        except (OSError, TimeoutError) as exc:
            return f"{key}: {url} is not reachable at startup ({type(exc).__name__}: {exc}); until it is, {effect}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None

    return [w for w in await asyncio.gather(*(one(*t) for t in targets)) if w]


class Mitigator:
    """One per sidecar: an HTTP client pool and the mode settings."""

    def __init__(self, cfg: Config, engine: Engine, client: httpx.AsyncClient | None = None,
                 metrics: Any = None) -> None:
        self.engine = engine
        self.metrics = metrics  # extproc.telemetry.metrics.Metrics or None
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
            result = self._failed(ctx, verdict, "timeout" if isinstance(exc, TimeoutError) else "error"), None
        ctx.mark("mitigate", t0)
        final, new_body = result
        return replace(final, latency_ms=ctx.spent_ms), new_body

    def _failed(self, ctx: RequestContext, verdict: Verdict, outcome: str) -> Verdict:
        """The first verdict, saying that the mitigation did not finish."""
        if ctx.decision.mode == "standard":
            self._count_refinement(outcome)
            return replace(verdict, original_score=verdict.score, refined=False, refine_rejected=(outcome,))
        if ctx.decision.mode == "premium":
            return replace(verdict, original_score=verdict.score, verifiers=(0, len(self.premium.verifiers)))
        return verdict

    def _count_refinement(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.record_refinement(outcome)

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
        original = ctx.answers[pos] or ""
        best, best_result = original, ctx.choice_results[pos]
        passes = 1
        refined = False
        rejected: list[str] = []
        for _ in range(self.standard.max_iterations):
            spans = "\n".join(f"- {s.text}" for s in best_result.spans) or "- (the answer as a whole)"
            messages = list(request["messages"]) + [
                {"role": "assistant", "content": best},
                {"role": "user", "content": REFINE_INSTRUCTION.format(spans=spans, context=_passages(ctx.grounding))},
            ]
            try:
                rewrite = await self._ask(self.standard.upstream_url or "", request.get("model"), messages,
                                          self._caller_auth(ctx), self.standard.timeout_ms)
            except httpx.HTTPError as exc:
                log.warning("request %s: standard mode upstream %s failed: %r", ctx.request_id,
                            self.standard.upstream_url, exc)
                rewrite = None
            outcome = UPSTREAM_ERROR if rewrite is None else rewrite_problem(ctx.question, original, rewrite)
            if outcome is None:
                result = await asyncio.wait_for(
                    self.engine.detect(ctx.grounding, ctx.question, rewrite, ctx.decision.signals),
                    self.detect_timeout_s)
                passes += 1
                outcome = ACCEPTED if better(result.score, best_result.score) else NOT_BETTER
            self._count_refinement(outcome)
            if outcome != ACCEPTED:  # the LLM is not helping: asking again costs time for the same reply
                rejected.append(outcome)
                break
            best, best_result, refined = rewrite, result, True
            if best_result.score < ctx.decision.threshold:
                break
        facts = {"original_score": verdict.score, "refined": refined, "refine_rejected": tuple(rejected)}
        if not refined:
            return replace(verdict, iterations=passes, **facts), None
        choice["message"]["content"] = best
        ctx.choice_results[pos] = best_result
        final = Verdict.checked(ctx.decision, best_result, iterations=passes)
        return replace(final, **facts), dump_json(response)

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

        replies = await asyncio.gather(*(one(v) for v in verifiers))
        if self.metrics is not None:
            for v, reply in zip(verifiers, replies):
                self.metrics.record_verifier_call(v.name, bool(reply))
        answers = [a for a in replies if a]
        facts = {"original_score": verdict.score, "verifiers": (len(answers), len(verifiers))}
        if not answers:
            log.warning("request %s: no verifier answered; keeping the lightweight verdict", ctx.request_id)
            return replace(verdict, **facts)
        pos = max(ctx.choice_results, key=lambda i: ctx.choice_results[i].score)
        original = ctx.choice_results[pos]
        # the same answer, judged against what the verifiers said instead of the documents
        answer_text = ctx.answers[pos] or ""
        against = await asyncio.wait_for(self.engine.detect(tuple(answers), ctx.question, answer_text),
                                         self.detect_timeout_s)
        confirmed = tuple(s for s in original.spans if _overlaps(s, against.spans))
        score = cross_check_score(original.score, against.score, bool(confirmed), ctx.decision.threshold)
        result = DetectionResult(score=score, spans=confirmed, latency_ms=original.latency_ms + against.latency_ms)
        ctx.choice_results[pos] = result
        return replace(Verdict.checked(ctx.decision, result, iterations=2, require_spans=True), **facts)

    async def close(self) -> None:
        await self.client.aclose()
