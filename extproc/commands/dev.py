"""`truthlens dev`: demo upstream + sidecar + Envoy on loopback, in that order (what `make run` does).

Start order matters: Envoy answers 500 (or, fail-open, unjudged traffic) while the processor is
unreachable, so the sidecar must report gRPC health SERVING before Envoy starts, and traffic is
announced only once Envoy's admin /ready says so. Ctrl-C / SIGTERM stops all three, Envoy first.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from extproc.config import ConfigError
from extproc.devtools.processes import terminate, wait_grpc_serving, wait_http_ok


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TruthLens YAML config for the sidecar")
    p.add_argument("--listen-port", type=int, default=8080, help="Envoy listener port (default 8080)")
    p.add_argument("--admin-port", type=int, default=9901, help="Envoy admin port (default 9901)")
    p.add_argument("--grpc-address", default="127.0.0.1:50051", help="sidecar gRPC address")
    p.add_argument("--metrics-address", default="127.0.0.1:9464", help="sidecar /metrics address")
    p.add_argument("--upstream", default=None,
                   help="front this LLM base URL instead of the demo upstream (also what standard mode re-asks, "
                        "unless the config sets truthlens.modes.standard.upstream_url)")
    p.add_argument("--demo-port", type=int, default=8000, help="demo upstream port (default 8000)")
    p.add_argument("--model", default=None,
                   help="model name in the printed examples (default: the demo's, or the first the upstream's "
                        "/v1/models lists)")
    p.add_argument("--envoy-bin", default=None, help="Envoy binary (default: $TRUTHLENS_ENVOY_BIN, .venv-envoy)")
    p.add_argument("--fail-closed", action="store_true", help="failure_mode_allow=false: sidecar errors become 500s")
    p.add_argument("--message-timeout", type=float, default=10.0, help="Envoy ext_proc message_timeout (s)")
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for each component")
    p.add_argument("--envoy-log-level", default="warning")


def run(args: argparse.Namespace) -> int:
    from extproc.commands.serve import read_config
    from extproc.devtools.demo_upstream import start_demo_upstream
    from extproc.devtools.envoy_config import EnvoyOptions, resolve_envoy_binary, write_config

    try:
        envoy_bin = resolve_envoy_binary(args.envoy_bin)
    except FileNotFoundError as exc:
        print(f"truthlens dev: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    demo = None
    upstream = args.upstream
    if upstream is None:
        demo = start_demo_upstream(port=args.demo_port)
        upstream = demo.url
        print(f"[1/3] demo upstream   {upstream}  (OpenAI-compatible, deterministic)", flush=True)
    else:
        print(f"[1/3] upstream        {upstream}", flush=True)

    procs: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="truthlens-dev-"))
    try:
        try:  # the sidecar validates too; failing here names the key before anything else starts
            cfg = read_config(args.config, upstream)  # as the sidecar will read it; Envoy takes its cap from it
        except ConfigError as exc:
            print(f"truthlens dev: invalid config {exc.source}:", file=sys.stderr)
            for line in exc.errors:
                print(f"  {line}", file=sys.stderr)
            return 2
        # standard mode re-asks the LLM that Envoy fronts, unless the config names another
        cmd = [sys.executable, "-m", "extproc.commands.serve", "--grpc-address", args.grpc_address,
               "--metrics-address", args.metrics_address, "--upstream-url", upstream]
        if args.config:
            cmd += ["--config", args.config]
        sidecar = subprocess.Popen(cmd)
        procs.append(sidecar)
        if not wait_grpc_serving(args.grpc_address, args.startup_timeout, sidecar, stop):
            print("truthlens dev: sidecar did not become SERVING", file=sys.stderr)
            return 1
        print(f"[2/3] sidecar         {args.grpc_address}  (gRPC health SERVING; metrics "
              f"http://{args.metrics_address}/metrics)", flush=True)

        opts = EnvoyOptions(listen_port=args.listen_port, admin_port=args.admin_port,
                            sidecar_address=args.grpc_address, upstream_url=upstream,
                            failure_mode_allow=not args.fail_closed, message_timeout_s=args.message_timeout,
                            max_message_timeout_s=cfg.server.envoy_max_message_timeout_s)
        cfg_path = write_config(opts, workdir / "envoy.yaml")
        envoy = subprocess.Popen([envoy_bin, "-c", str(cfg_path), "--log-level", args.envoy_log_level,
                                  "--disable-hot-restart", "--concurrency", "2"])
        procs.append(envoy)
        if not wait_http_ok(f"http://127.0.0.1:{args.admin_port}/ready", args.startup_timeout, envoy, stop):
            print("truthlens dev: Envoy did not become ready", file=sys.stderr)
            return 1
        print(f"[3/3] envoy           http://127.0.0.1:{args.listen_port}  (admin http://127.0.0.1:{args.admin_port})",
              flush=True)
        print(usage(args.listen_port, args.model or example_model(upstream, demo is not None)), flush=True)
        while not stop.is_set():
            for p in procs:
                if p.poll() is not None:
                    print(f"truthlens dev: {p.args[0]} exited with {p.returncode}", file=sys.stderr)
                    return 1
            stop.wait(0.5)
        return 0
    finally:
        for p in reversed(procs):  # Envoy first: no new traffic reaches a stopping sidecar
            terminate(p)
        if demo is not None:
            demo.stop()
        for f in workdir.iterdir():
            f.unlink()
        workdir.rmdir()


EXAMPLE_CONTEXT = "The Eiffel Tower was built from 1887 to 1889 in Paris."
EXAMPLE_QUESTION = "When was the Eiffel Tower built?"
MODEL_PLACEHOLDER = "MODEL"


def example_model(upstream: str, demo: bool) -> str:
    """The model the printed examples name: the demo's, else the first one the upstream lists."""
    from extproc.devtools.demo_upstream import DEMO_MODEL

    if demo:
        return DEMO_MODEL
    return upstream_model(upstream) or MODEL_PLACEHOLDER


def upstream_model(base_url: str, timeout_s: float = 5.0) -> str | None:
    """The first model id of an OpenAI-compatible `GET /v1/models` (bearer $OPENAI_API_KEY when set), or None."""
    import os

    import httpx

    key = os.environ.get("OPENAI_API_KEY")
    try:
        r = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout_s,
                      headers={"authorization": f"Bearer {key}"} if key else {})
        data = r.json().get("data") if r.status_code == 200 else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return next((i for i in ids if isinstance(i, str) and i), None)


def usage(port: int, model: str) -> str:
    """The commands `truthlens dev` prints; each works as printed (tests/e2e/test_dev_examples.py runs them).

    The document rides in the user turn (`Context:` / `Question:`), so a real upstream sees it too; the
    openai example is printed only when this interpreter can import `openai`, and names the interpreter.
    """
    import importlib.util
    import json
    import shlex

    base = f"http://127.0.0.1:{port}"
    content = f"Context: {EXAMPLE_CONTEXT}\nQuestion: {EXAMPLE_QUESTION}"
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}]})
    stream = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": content}]})
    note = (f"\n  (replace {MODEL_PLACEHOLDER} with a model the upstream serves, or pass --model)\n"
            if model == MODEL_PLACEHOLDER else "")
    text = f"""
TruthLens is up. Try:
{note}
  curl -si {base}/v1/chat/completions -H 'content-type: application/json' \\
    -d {shlex.quote(body)}

  # streaming (verdict arrives as the last event before [DONE]):
  curl -sN {base}/v1/chat/completions -H 'content-type: application/json' \\
    -d {shlex.quote(stream)}
"""
    if importlib.util.find_spec("openai") is not None:
        q = json.dumps  # double-quoted literals: the shell quoting stays one pair of single quotes
        code = (f"import openai; c = openai.OpenAI(base_url={q(base + '/v1')}, api_key={q('x')}); "
                f"r = c.chat.completions.with_raw_response.create(model={q(model)}, "
                f"messages=[{{{q('role')}: {q('user')}, {q('content')}: {q(content)}}}]); "
                f"print(r.headers.get({q('x-truthlens-status')}), r.headers.get({q('x-truthlens-score')}))")
        text += f"\n  {shlex.quote(sys.executable)} -c {shlex.quote(code)}\n"
    else:
        text += (f"\n  # the openai client: {shlex.quote(sys.executable)} -m pip install openai, "
                 "then restart for its example\n")
    return text + "\nCtrl-C stops all three.\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m extproc.commands.dev`: the same command without loading the other subcommands."""
    parser = argparse.ArgumentParser(prog="truthlens dev", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
