"""Scrape the real Prometheus exposition: names and labels must be exactly the documented ones."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from extproc.telemetry.metrics import Metrics, start_metrics_server


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def exercise(m: Metrics) -> None:
    m.record_detection("medical", "lightweight", True, 0.83, 1)
    m.record_detection(None, "standard", False, 0.12, 2)
    m.record_latency("lightweight", "detect", 0.02)
    m.record_latency("lightweight", "sentinel", 0.003)
    m.record_sentinel_decision("prefilter")
    m.record_sentinel_decision("prefilter")
    m.record_sentinel_decision("model")
    m.record_skipped()
    m.record_unverified()
    m.record_unchecked("timeout")
    m.record_unchecked("timeout")
    m.record_refinement("accepted")
    m.record_refinement("refusal")
    m.record_refinement("refusal")
    m.record_verifier_call("verifier-a", True)
    m.record_verifier_call("verifier-b", False)
    m.set_models([("modernbert-detector", "detector"), ("minilm-sentinel", "sentinel")])


def test_exposition_has_exact_names_and_labels() -> None:
    m = Metrics()
    exercise(m)
    text = m.exposition().decode()
    s = samples(text)
    assert {(tuple(sorted(l.items())), v) for l, v in s["truthlens_detections_total"]} == {
        ((("decision", "medical"), ("detected", "true"), ("mode", "lightweight")), 1.0),
        ((("decision", "default"), ("detected", "false"), ("mode", "standard")), 1.0),
    }
    assert s["truthlens_score_count"] == [({}, 2.0)]
    assert s["truthlens_score_sum"][0][1] == 0.83 + 0.12
    assert s["truthlens_iterations_sum"] == [({}, 3.0)]
    latency = {l["operation"]: v for l, v in s["truthlens_latency_seconds_count"]}
    assert latency == {"detect": 1.0, "sentinel": 1.0}
    assert all(set(l) == {"mode", "operation"} for l, _ in s["truthlens_latency_seconds_count"])
    assert s["truthlens_skipped_total"] == [({}, 1.0)]
    assert s["truthlens_unverified_total"] == [({}, 1.0)]
    assert s["truthlens_unchecked_total"] == [({"reason": "timeout"}, 2.0)]
    assert dict((l["by"], v) for l, v in s["truthlens_sentinel_decisions_total"]) == {"prefilter": 2.0, "model": 1.0}
    assert dict((l["outcome"], v) for l, v in s["truthlens_refinements_total"]) == {"accepted": 1.0, "refusal": 2.0}
    assert sorted((l["verifier"], l["outcome"], v) for l, v in s["truthlens_verifier_calls_total"]) == [
        ("verifier-a", "answered", 1.0), ("verifier-b", "failed", 1.0)]
    assert sorted(s["truthlens_models_used"], key=lambda x: x[0]["role"]) == [
        ({"model": "modernbert-detector", "role": "detector"}, 1.0),
        ({"model": "minilm-sentinel", "role": "sentinel"}, 1.0),
    ]
    # every truthlens family is one of the documented names: no _ratio/_seconds_total surprises
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names == {
        "truthlens_detections_total",
        "truthlens_score",
        "truthlens_latency_seconds",
        "truthlens_iterations",
        "truthlens_models_used",
        "truthlens_skipped_total",
        "truthlens_unverified_total",
        "truthlens_unchecked_total",
        "truthlens_sentinel_decisions_total",
        "truthlens_refinements_total",
        "truthlens_verifier_calls_total",
    }
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}
    assert types["truthlens_score"] == "histogram" and types["truthlens_models_used"] == "gauge"
    assert types["truthlens_unchecked_total"] == "counter"


def test_score_buckets_cover_zero_to_one() -> None:
    m = Metrics()
    m.record_detection("d", "lightweight", False, 0.42, 1)
    buckets = {l["le"]: v for l, v in samples(m.exposition().decode())["truthlens_score_bucket"]}
    assert buckets["0.4"] == 0.0 and buckets["0.5"] == 1.0 and buckets["1.0"] == 1.0


def test_counters_without_labels_exist_before_first_event() -> None:
    s = samples(Metrics().exposition().decode())
    assert s["truthlens_skipped_total"] == [({}, 0.0)]
    assert s["truthlens_unverified_total"] == [({}, 0.0)]


def test_two_instances_do_not_share_state() -> None:
    a, b = Metrics(), Metrics()
    a.record_skipped()
    assert samples(b.exposition().decode())["truthlens_skipped_total"] == [({}, 0.0)]
    assert samples(a.exposition().decode())["truthlens_skipped_total"] == [({}, 1.0)]


def test_http_server_serves_the_registry() -> None:
    m = Metrics()
    exercise(m)
    server = start_metrics_server("127.0.0.1:0", m)
    try:
        assert server.port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert response.status == 200
        assert 'truthlens_unchecked_total{reason="timeout"} 2.0' in body
    finally:
        server.close()
