"""Config loading: the documented example parses, and every error names its key path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from extproc.config import (
    Config,
    ConfigError,
    config_to_dict,
    config_warnings,
    default_config,
    load_config,
    model_dir,
    parse_config,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "truthlens.example.yaml"


def errors_of(mapping: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(mapping)  # type: ignore[arg-type]
    return list(info.value.errors)


def test_example_parses_into_typed_attributes() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.server.grpc_address == "127.0.0.1:50051"
    assert cfg.truthlens.thresholds.token == 0.4
    assert cfg.truthlens.models.detector == "auto"
    assert cfg.truthlens.models.detector_dirs == ("models/detector", "models/detector-full")
    assert cfg.truthlens.modes.standard.max_iterations == 2
    medical, internal = cfg.decisions
    assert medical.name == "medical" and medical.priority == 100
    assert medical.plugins.truthlens.action == "warn"
    assert medical.plugins.truthlens.threshold == 0.4
    assert medical.rules.conditions[0].keywords == ("dosage", "symptom", "diagnosis", "medication")
    assert internal.rules.operator == "AND"
    assert internal.plugins.truthlens.enabled is False
    assert internal.plugins.truthlens.mode is None  # unset: inherits the global default


def test_example_shows_the_defaults() -> None:
    """The example documents every default: apart from the decisions it equals an empty config."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw.pop("decisions")
    assert parse_config(raw) == default_config()


def test_default_token_threshold_is_the_bundled_detectors() -> None:
    """Retraining the default detector moves its dev-chosen threshold; the config default must follow."""
    manifest = json.loads((EXAMPLE.parents[1] / "models" / "detector" / "truthlens.json").read_text())
    assert default_config().truthlens.thresholds.token == manifest["provenance"]["recommended_token_threshold"]
    assert default_config().truthlens.models.detector_dirs[0] == "models/detector"


def test_default_response_threshold_and_score_method_follow_the_bundled_calibration() -> None:
    """Refitting the calibration moves the calibrated operating point; the config default must follow,
    and the calibration must be for the default score method and the default explainer's model file."""
    fits = json.loads((EXAMPLE.parents[1] / "models" / "detector" / "calibration.json").read_text())["fits"]
    tl = default_config().truthlens
    detector = tl.models.detector_dirs[0]
    assert all(tl.thresholds.response == f["fitted_on"]["recommended_response_threshold"] for f in fits)
    assert all(tl.score_method == f["raw_score"] == "fused" for f in fits)
    base, stacked = sorted(fits, key=lambda f: len(f["signals"]))
    assert base["fitted_on"]["models"] == {"detector": detector, "explainer": tl.models.explainer}
    assert stacked["fitted_on"]["models"] == {"detector": detector, "explainer": tl.models.explainer,
                                              "surrogate": tl.models.surrogate}
    assert list(stacked["signals"]) == ["context_pmi"] and tl.signals.context_pmi


@pytest.mark.parametrize("name", ["detector-deep", "detector-full"])
def test_the_optional_detectors_ship_their_own_calibration(name: str) -> None:
    from extproc.inference.calibration import CalibrationSet, check_models

    root = EXAMPLE.parents[1] / "models"
    # a fit stacked with context PMI must be for the surrogate the default detector's stack uses
    (surrogate,) = {c.models["surrogate"] for c in CalibrationSet.load(root / "detector" / "calibration.json").fits
                    if "surrogate" in c.models}
    fits = CalibrationSet.load(root / name / "calibration.json").fits
    for cal in fits:
        check_models(cal, {"detector": root / name / "model.onnx", "explainer": root / "explainer" / "model.onnx"},
                     f"models/{name}/calibration.json", {"surrogate": surrogate})  # fitted for the committed files
        assert cal.raw_score == "fused" and 0.0 < cal.fitted_on["recommended_response_threshold"] < 1.0
    assert any(not c.signals for c in fits)  # the fallback when the surrogate is off


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == Config()


def test_config_is_frozen() -> None:
    cfg = default_config()
    with pytest.raises(AttributeError):
        cfg.server.grpc_address = "x"  # type: ignore[misc]


def test_dump_round_trips() -> None:
    cfg = load_config(EXAMPLE)
    dumped = yaml.safe_dump(config_to_dict(cfg))
    assert parse_config(yaml.safe_load(dumped)) == cfg
    # header conditions dump only their own keys, so the dump stays valid
    assert config_to_dict(cfg)["decisions"][1]["rules"]["conditions"][0] == {
        "type": "header",
        "name": "x-team",
        "value": "platform",
    }


def test_integers_are_accepted_for_float_fields() -> None:
    cfg = parse_config({"truthlens": {"thresholds": {"token": 1}}, "server": {"shutdown_grace_s": 3}})
    assert cfg.truthlens.thresholds.token == 1.0 and isinstance(cfg.truthlens.thresholds.token, float)


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"truthlens": {"default_mode": "fast"}}, "truthlens.default_mode: expected one of lightweight | standard | premium, got 'fast'"),
        ({"truthlens": {"default_action": "drop"}}, "truthlens.default_action: expected one of header | warn | block | none, got 'drop'"),
        ({"truthlens": {"models": {"provider": "rocm"}}}, "truthlens.models.provider: expected one of auto | cuda | cpu"),
        ({"truthlens": {"score_method": "mean"}}, "truthlens.score_method: expected one of fused | noisy_or | max_span"),
        ({"truthlens": {"thresholds": {"token": 1.5}}}, "truthlens.thresholds.token: expected a number in [0, 1], got 1.5"),
        ({"truthlens": {"thresholds": {"response": -0.1}}}, "truthlens.thresholds.response: expected a number in [0, 1], got -0.1"),
        ({"truthlens": {"thresholds": {"sentinel": "high"}}}, "truthlens.thresholds.sentinel: expected a number, got 'high'"),
        ({"truthlens": {"thresholds": {"min_span_tokens": 0}}}, "truthlens.thresholds.min_span_tokens: expected an integer >= 1, got 0"),
        ({"truthlens": {"enabled": "yes"}}, "truthlens.enabled: expected true or false, got 'yes'"),
        ({"truthlens": {"max_body_bytes": 1.5}}, "truthlens.max_body_bytes: expected an integer, got 1.5"),
        ({"truthlens": {"max_body_bytes": True}}, "truthlens.max_body_bytes: expected an integer, got true"),
        ({"truthlens": {"block_status": 200}}, "truthlens.block_status: expected an integer in [400, 599], got 200"),
        ({"truthlens": {"models": {"detector": 3}}}, "truthlens.models.detector: expected a string or null, got 3"),
        ({"truthlens": {"models": []}}, "truthlens.models: expected a mapping, got an empty list"),
        ({"server": {"grpc_address": "localhost"}}, "server.grpc_address: expected host:port or unix:/path, got 'localhost'"),
        ({"server": {"grpc_address": "127.0.0.1:70000"}}, "server.grpc_address: expected host:port or unix:/path"),
        ({"server": {"metrics_address": "unix:/tmp/m.sock"}}, "server.metrics_address: expected host:port with a port in 0..65535"),
        ({"truthlens": {"modes": {"standard": {"upstream_url": "localhost:8000"}}}}, "truthlens.modes.standard.upstream_url: expected an http:// or https:// URL with a host"),
        ({"telemetry": {"log_level": "trace"}}, "telemetry.log_level: expected one of debug | info | warning | error"),
        ({"truthlens": {"warning_template": "score {score} {answer}"}}, "truthlens.warning_template: expected a format string using only {score} and {spans}"),
        ({"truthlens": {"warning_template": "{spans:.2f}"}}, "truthlens.warning_template: expected a format string using only {score} and {spans}"),
        ({"truthlens": {"warning_template": "{score"}}, "truthlens.warning_template: expected a format string"),
        ([1, 2], "<root>: expected a mapping, got a list"),
    ],
)
def test_each_error_names_its_key_path(mapping: object, expected: str) -> None:
    errors = errors_of(mapping)
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected)


def test_addresses_that_parse() -> None:
    cfg = parse_config({"server": {"grpc_address": "unix:/run/truthlens.sock", "metrics_address": "[::1]:0"}})
    assert cfg.server.grpc_address == "unix:/run/truthlens.sock"
    assert parse_config({"server": {"grpc_address": "0.0.0.0:50051"}}).server.grpc_address == "0.0.0.0:50051"


def test_unknown_key_is_an_error_with_a_suggestion() -> None:
    (error,) = errors_of({"server": {"grpc_adress": "127.0.0.1:1"}})
    assert error == "server.grpc_adress: expected a known key (did you mean 'grpc_address'?), got unknown key 'grpc_adress'"
    (error,) = errors_of({"truthlens": {"thresholds": {"tokn": 0.2}}})
    assert "truthlens.thresholds.tokn" in error and "did you mean 'token'?" in error
    (error,) = errors_of({"zzz": 1})
    assert error.startswith("zzz: expected a known key (known keys: decisions, server, telemetry, truthlens)")


def test_all_errors_are_reported_together() -> None:
    errors = errors_of(
        {
            "server": {"grpc_address": "nope"},
            "truthlens": {"thresholds": {"token": 2}, "default_mode": "x"},
            "telemetry": {"log_content": "no"},
        }
    )
    paths = [e.split(":", 1)[0] for e in errors]
    assert paths == ["server.grpc_address", "truthlens.default_mode", "truthlens.thresholds.token", "telemetry.log_content"]
    assert str(ConfigError(errors)).splitlines() == errors


def test_decision_errors_name_index_and_key() -> None:
    errors = errors_of(
        {
            "decisions": [
                {
                    "name": "a",
                    "rules": {
                        "operator": "XOR",
                        "conditions": [
                            {"type": "keyword", "keywords": []},
                            {"type": "header", "keywords": ["x"], "name": "x-a"},
                            {"type": "dom"},
                            {"type": "domain", "domains": ["not a domain"]},
                            {"type": "header"},
                        ],
                    },
                    "plugins": {"truthlens": {"threshold": 2, "action": "blok", "mode": None}},
                },
                {"name": "a", "rules": {"conditions": [{"type": "header", "name": "x-b"}]}},
                {"rules": {"conditions": []}},
                {"name": "bad name!", "rules": {"conditions": [{"type": "header", "name": "bad header"}]}},
            ]
        }
    )
    assert errors == [
        "decisions[0].rules.operator: expected one of AND | OR, got 'XOR'",
        "decisions[0].rules.conditions[0].keywords: expected a non-empty list, got an empty list",
        "decisions[0].rules.conditions[1].keywords: expected only name, type, value for this condition type, got key 'keywords'",
        "decisions[0].rules.conditions[2].type: expected one of keyword | domain | header, got 'dom'",
        "decisions[0].rules.conditions[3].domains[0]: expected a host name like example.com, got 'not a domain'",
        "decisions[0].rules.conditions[4].name: expected a string, got nothing (required key missing)",
        "decisions[0].plugins.truthlens.threshold: expected a number in [0, 1], got 2",
        "decisions[0].plugins.truthlens.action: expected one of header | warn | block | none or null, got 'blok'",
        "decisions[2].name: expected a string, got nothing (required key missing)",
        "decisions[2].rules.conditions: expected a non-empty list, got an empty list",
        "decisions[3].name: expected a name of letters, digits, '.', '_' or '-' (at most 63), got 'bad name!'",
        "decisions[3].rules.conditions[0].name: expected an HTTP header name, got 'bad header'",
        "decisions[1].name: expected a unique name, got 'a' (also decisions[0])",
    ]


def test_decision_requires_rules() -> None:
    (error,) = errors_of({"decisions": [{"name": "x"}]})
    assert error == "decisions[0].rules: expected a mapping, got nothing (required key missing)"


def test_tls_files_must_exist_when_enabled(tmp_path: Path) -> None:
    errors = errors_of({"server": {"tls": {"enabled": True, "client_ca_file": str(tmp_path / "ca.pem")}}})
    assert errors == [
        "server.tls.cert_file: expected a file path when server.tls.enabled is true, got null",
        "server.tls.key_file: expected a file path when server.tls.enabled is true, got null",
        f"server.tls.client_ca_file: expected an existing file, got '{tmp_path / 'ca.pem'}'",
    ]
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    tls = {"enabled": True, "cert_file": str(tmp_path / "cert.pem"), "key_file": str(tmp_path / "key.pem")}
    assert parse_config({"server": {"tls": tls}}).server.tls.mtls is False
    tls["client_ca_file"] = str(tmp_path / "ca.pem")
    assert parse_config({"server": {"tls": tls}}).server.tls.mtls is True


def test_tls_files_are_not_checked_when_disabled() -> None:
    cfg = parse_config({"server": {"tls": {"cert_file": "/nonexistent/cert.pem"}}})
    assert cfg.server.tls.enabled is False


def test_premium_verifiers() -> None:
    verifier = {"name": "v", "base_url": "https://api.example.com/v1", "model": "m", "api_key_env": "KEY"}
    cfg = parse_config({"truthlens": {"modes": {"premium": {"verifiers": [verifier]}}}})
    assert cfg.truthlens.modes.premium.verifiers[0].base_url == "https://api.example.com/v1"
    errors = errors_of({"truthlens": {"modes": {"premium": {"verifiers": [verifier, {"name": "v"}]}}}})
    assert errors == [
        "truthlens.modes.premium.verifiers[1].base_url: expected a string, got nothing (required key missing)",
        "truthlens.modes.premium.verifiers[1].model: expected a string, got nothing (required key missing)",
        "truthlens.modes.premium.verifiers[1].name: expected a unique name, got 'v' (also truthlens.modes.premium.verifiers[0])",
    ]


def test_yaml_syntax_and_duplicate_keys(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  grpc_address: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert info.value.errors[0].startswith(f"{bad}: expected valid YAML, got ")
    dup = tmp_path / "dup.yaml"
    dup.write_text("truthlens:\n  enabled: true\n  enabled: false\n")
    with pytest.raises(ConfigError) as info:
        load_config(dup)
    assert info.value.errors == ("truthlens.enabled: expected unique keys in a mapping, got 'enabled' twice "
                                 "(lines 2 and 3)",)  # the key path (#17)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert "expected a readable file" in info.value.errors[0]


def test_model_paths_resolve_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "detector").mkdir(parents=True)
    cfg = parse_config({"truthlens": {"models": {"sentinel": None, "explainer": "/abs/explainer"}}})
    assert model_dir(cfg.truthlens.models.detector_dirs[0]) == tmp_path / "models" / "detector"
    assert model_dir(cfg.truthlens.models.sentinel) is None
    warnings = config_warnings(cfg)
    assert len(warnings) == 1  # detector exists, sentinel is null, explainer is missing
    assert warnings[0].startswith("truthlens.models.explainer: model directory '/abs/explainer' not found")


def test_configuration_doc_explains_every_key() -> None:
    doc = (EXAMPLE.parent / "configuration.md").read_text()

    def paths(node: object, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node:
            return [p for k, v in node.items() for p in paths(v, f"{prefix}{k}.")]
        return [prefix.rstrip(".")]

    keys = [p for p in paths(config_to_dict(default_config())) if p != "decisions"]
    assert len(keys) > 40 and "truthlens.thresholds.token" in keys
    assert [p for p in keys if f"`{p}`" not in doc] == []


def test_condition_keys_required_by_type_reject_null() -> None:
    conditions = [{"type": "header", "name": None}, {"type": "keyword", "keywords": None}]
    assert errors_of({"decisions": [{"name": "a", "rules": {"conditions": conditions}}]}) == [
        "decisions[0].rules.conditions[0].name: expected a string, got null",
        "decisions[0].rules.conditions[1].keywords: expected a list of strings, got null",
    ]


def test_remote_inference_keys_validate_and_skip_local_model_warnings(tmp_path: Path) -> None:
    cfg = parse_config({"truthlens": {"inference": {"remote": ["10.0.0.1:50052", "dns:///pool.ns.svc:50052"]},
                                      "models": {"detector": str(tmp_path / "missing")}}})
    assert cfg.truthlens.inference.remote == ("10.0.0.1:50052", "dns:///pool.ns.svc:50052")
    assert config_warnings(cfg) == []  # the pool loads the models
    slow = parse_config({"truthlens": {"inference_timeout_ms": 1000, "inference": {"remote": ["a:1"], "deadline_ms": 1000}}})
    assert config_warnings(slow)[0].startswith("truthlens.inference.deadline_ms: 1000 is not below")
    assert errors_of({"truthlens": {"inference": {"remote": ["pool"], "retries": -1, "load_balancing": "random"}}}) == [
        "truthlens.inference.remote[0]: expected host:port or dns:///host:port, got 'pool'",
        "truthlens.inference.retries: expected an integer >= 0, got -1",
        "truthlens.inference.load_balancing: expected one of round_robin | pick_first, got 'random'",
    ]


VERIFIER = {"name": "v", "base_url": "https://verifier.example.com/v1", "model": "m"}


def routed(mode: str, enabled: bool | None = None) -> dict:
    plugin = {"mode": mode} | ({} if enabled is None else {"enabled": enabled})
    return {"name": "r", "rules": {"conditions": [{"type": "header", "name": "x-r"}]}, "plugins": {"truthlens": plugin}}


def test_standard_mode_needs_an_upstream_url_naming_the_key_and_who_uses_it() -> None:
    """No default address: re-asking a guessed 127.0.0.1:8000 failed silently (#17)."""
    assert default_config().truthlens.modes.standard.upstream_url is None
    assert errors_of({"truthlens": {"default_mode": "standard"}}) == [
        "truthlens.modes.standard.upstream_url: expected the URL of the LLM that standard mode re-asks "
        "(standard is used by truthlens.default_mode), got null"]
    (error,) = errors_of({"decisions": [routed("standard")]})
    assert error.startswith("truthlens.modes.standard.upstream_url: ") and "decisions[0].plugins.truthlens.mode" in error
    parse_config({"decisions": [routed("standard", enabled=False)]})  # a disabled decision never re-asks
    ok = parse_config({"truthlens": {"default_mode": "standard", "modes": {"standard": {"upstream_url": "http://llm:8000"}}}})
    assert ok.truthlens.modes.standard.upstream_url == "http://llm:8000"


def test_premium_mode_needs_a_verifier_naming_the_key() -> None:
    assert errors_of({"truthlens": {"default_mode": "premium"}}) == [
        "truthlens.modes.premium.verifiers: expected at least one verifier "
        "(premium is used by truthlens.default_mode), got []"]
    (error,) = errors_of({"decisions": [routed("premium")]})
    assert error.startswith("truthlens.modes.premium.verifiers: ")
    parse_config({"truthlens": {"default_mode": "premium", "modes": {"premium": {"verifiers": [VERIFIER]}}}})


def test_fill_supplies_an_unset_key_and_never_overrides_the_file(tmp_path: Path) -> None:
    """What `truthlens dev --upstream` / `serve --upstream-url` do for truthlens.modes.standard.upstream_url."""
    fill = {"truthlens.modes.standard.upstream_url": "http://127.0.0.1:9999"}
    cfg = parse_config({"truthlens": {"default_mode": "standard"}}, fill=fill)
    assert cfg.truthlens.modes.standard.upstream_url == "http://127.0.0.1:9999"
    path = tmp_path / "tl.yaml"
    path.write_text("truthlens:\n  default_mode: standard\n  modes:\n    standard:\n      upstream_url: http://llm:1\n")
    assert load_config(path, fill=fill).truthlens.modes.standard.upstream_url == "http://llm:1"
    assert parse_config(None, fill=fill).truthlens.modes.standard.upstream_url == "http://127.0.0.1:9999"
    # a filled value is validated like one from the file
    assert errors_of_fill({"truthlens.modes.standard.upstream_url": "localhost:1"}) == [
        "truthlens.modes.standard.upstream_url: expected an http:// or https:// URL with a host, got 'localhost:1'"]


def errors_of_fill(fill: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"truthlens": {"default_mode": "standard"}}, fill=fill)
    return list(info.value.errors)
