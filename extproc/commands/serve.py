"""`truthlens serve`: the ext_proc sidecar (gRPC + health + /metrics) until SIGTERM.

`truthlens serve --detector-api` serves the detection API (proto/truthlens/v1) over the local
models instead: what apps call without Envoy, and what a detector pool runs (docs/detector-api.md).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TruthLens YAML config (default: built-in defaults)")
    p.add_argument("--grpc-address", default=None, help="override server.grpc_address (host:port or unix:/path)")
    p.add_argument("--metrics-address", default=None, help="override server.metrics_address (host:port)")
    p.add_argument("--no-metrics", action="store_true", help="do not serve /metrics")
    p.add_argument("--log-level", default=None, help="override telemetry.log_level")
    p.add_argument("--detector-api", action="store_true",
                   help="serve the detection API (truthlens.v1.Detection + gRPC health) with the local models "
                        "instead of the ext_proc sidecar")
    p.add_argument("--port", type=int, default=None,
                   help="listen on this port (the host of --grpc-address / server.grpc_address is kept)")
    p.add_argument("--upstream-url", default=None,
                   help="the LLM standard mode re-asks when the config sets no truthlens.modes.standard.upstream_url "
                        "(truthlens dev passes the upstream it fronts)")


STANDARD_UPSTREAM_KEY = "truthlens.modes.standard.upstream_url"


def read_config(path: str | None, upstream_url: str | None = None):  # noqa: ANN201 - Config, imported lazily
    """The config file (or the defaults), with `upstream_url` filling truthlens.modes.standard.upstream_url
    where the file leaves it null; raises ConfigError naming every bad key."""
    from extproc.config import load_config, parse_config

    fill = {STANDARD_UPSTREAM_KEY: upstream_url} if upstream_url else None
    return load_config(path, fill=fill) if path else parse_config(None, source="<defaults>", fill=fill)


def run(args: argparse.Namespace) -> int:
    from extproc.config import ConfigError

    try:
        cfg = read_config(args.config, args.upstream_url)
    except ConfigError as exc:
        print(f"truthlens serve: invalid config {exc.source}:", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 2
    try:
        address = _address(args.grpc_address or cfg.server.grpc_address, args.port)
    except ValueError as exc:
        print(f"truthlens serve: {exc}", file=sys.stderr)
        return 2
    if args.detector_api:
        return asyncio.run(_serve_detector_api(cfg, args, address))
    return asyncio.run(_serve(cfg, args, address))


def _address(address: str, port: int | None) -> str:
    if port is None:
        return address
    if address.startswith("unix:"):
        raise ValueError(f"--port: the listen address {address} is a Unix socket")
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: expected 0..65535, got {port}")
    return f"{address.rpartition(':')[0]}:{port}"


async def _serve(cfg, args: argparse.Namespace, address: str) -> int:  # noqa: ANN001 - Config, imported lazily
    import logging

    from extproc.config import config_warnings
    from extproc.server import ServerOptions, SidecarServer
    from extproc.gateway.service import TruthLensService
    from extproc.telemetry.logging import configure_logging
    from extproc.gateway.wiring import GatewayRuntime, StartupError, build_engine, build_mitigator, writer_fusion

    configure_logging(args.log_level or cfg.telemetry.log_level, cfg.telemetry.log_content)
    from extproc.telemetry.tracing import TracingUnavailable, configure_tracing, shutdown_tracing

    tr = cfg.telemetry.tracing
    try:
        configure_tracing(tr.enabled, tr.otlp_endpoint, tr.service_name)
    except TracingUnavailable as exc:
        print(f"truthlens serve: {exc}", file=sys.stderr)
        return 2
    log = logging.getLogger("truthlens.serve")
    for warning in config_warnings(cfg):
        log.warning(warning)
    from extproc.gateway.mitigation import probe_llms

    for warning in await probe_llms(cfg):  # not fatal: an LLM briefly down at deploy time must not crash-loop us
        log.warning(warning)
    metrics = metrics_server = None
    if not args.no_metrics:
        from extproc.telemetry.metrics import Metrics, start_metrics_server

        metrics = Metrics(cfg.telemetry.tracing.service_name)
        metrics_server = start_metrics_server(args.metrics_address or cfg.server.metrics_address, metrics)
    try:
        writer_fusion(cfg)  # a file that cannot be used stops start-up before the models load (GatewayRuntime reads it)
    except StartupError as exc:
        print(f"truthlens serve: {exc}", file=sys.stderr)
        return 2
    try:
        engine = build_engine(cfg)
    except Exception as exc:  # noqa: BLE001 - e.g. provider cuda without a GPU: fail start-up, say why
        print(f"truthlens serve: cannot load models: {exc}", file=sys.stderr)
        return 2
    start = getattr(engine, "start", None)  # a remote engine asks its pool which models it serves
    if start is not None:
        await start()
    if metrics is not None:
        metrics.set_models((m.name, m.role) for m in engine.models())
    rt = GatewayRuntime(cfg, engine, metrics=metrics, mitigator=build_mitigator(cfg, engine, metrics))
    server = SidecarServer(TruthLensService(rt), ServerOptions.from_config(cfg, address))
    roles = ",".join(r for r in ("sentinel", "detector", "explainer") if engine.has(r)) or "none"
    try:
        await _run_announced(server, "sidecar", roles, metrics_server)
    finally:
        if rt.mitigator is not None:
            await rt.mitigator.close()
        await engine.close()
        if metrics_server is not None:
            metrics_server.close()
        shutdown_tracing()
    return 0


async def _serve_detector_api(cfg, args: argparse.Namespace, address: str) -> int:  # noqa: ANN001 - Config
    """The detection API over the local models (truthlens.inference.remote is ignored: a pool never chains)."""
    import logging

    from extproc.api.server import DetectorApiServer
    from extproc.config import config_warnings
    from extproc.gateway.wiring import build_local_engine
    from extproc.server import ServerOptions
    from extproc.telemetry.logging import configure_logging

    configure_logging(args.log_level or cfg.telemetry.log_level, cfg.telemetry.log_content)
    log = logging.getLogger("truthlens.serve")
    local = cfg
    if cfg.truthlens.inference.remote:
        import dataclasses

        log.warning("truthlens.inference.remote is ignored by --detector-api: it serves its local models")
        local = dataclasses.replace(cfg, truthlens=dataclasses.replace(
            cfg.truthlens, inference=dataclasses.replace(cfg.truthlens.inference, remote=())))
    for warning in config_warnings(local):
        log.warning(warning)
    metrics_server = None
    try:
        engine = build_local_engine(local)
    except Exception as exc:  # noqa: BLE001 - e.g. provider cuda without a GPU: fail start-up, say why
        print(f"truthlens serve: cannot load models: {exc}", file=sys.stderr)
        return 2
    if not args.no_metrics:
        from extproc.telemetry.metrics import Metrics, start_metrics_server

        metrics = Metrics(cfg.telemetry.tracing.service_name)
        metrics_server = start_metrics_server(args.metrics_address or cfg.server.metrics_address, metrics)
        metrics.set_models((m.name, m.role) for m in engine.models())
    server = DetectorApiServer(engine, ServerOptions.from_config(local, address))
    roles = ",".join(r for r in ("sentinel", "detector", "explainer", "surrogate") if engine.has(r)) or "none"
    try:
        await _run_announced(server, "detection API", roles, metrics_server)
    finally:
        await engine.close()
        if metrics_server is not None:
            metrics_server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m extproc.commands.serve`: the same command without loading the other subcommands."""
    parser = argparse.ArgumentParser(prog="truthlens serve", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


async def _run_announced(server: Any, what: str, roles: str, metrics_server: Any) -> None:
    """Serve until SIGTERM/SIGINT; once serving, print the ready line tests and operators wait for."""
    from extproc.server import run_until_signal

    ready = asyncio.Event()
    task = asyncio.ensure_future(run_until_signal(server, ready))
    await ready.wait()
    metrics = f"; metrics on {metrics_server.host}:{metrics_server.port}" if metrics_server else ""
    print(f"truthlens: {what} ready on {server.address} (models: {roles}{metrics})", flush=True)
    await task


if __name__ == "__main__":
    sys.exit(main())
