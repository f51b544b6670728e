"""A long fuzz run of the hostile-input contracts (#19): millions of plain random inputs, no shrinking.

The bounded hypothesis tests (tests/unit/protocol/test_hostile_input.py,
tests/unit/config/test_config_fuzz.py) check the same contracts in `make test`; this runs them
over many more inputs, fast: a seeded `random.Random`, structured JSON/SSE/YAML generators with
byte-level mutations (truncation, flips, insertions, lone-surrogate escapes, CR/LF splits).

Contracts, per target (anything else is a crash, counted and sampled in the report):

- ``parse_chat_request``: only ProtocolError; extracted text is valid Unicode; a body forwarded
  upstream (`upstream_body`, also on errors) parses and holds no RAG field
- ``parse_chat_response``: only ProtocolError; answers, id and model are valid Unicode
- ``append_to_choices``: only ProtocolError; the result is JSON
- ``sse``: the parser never raises and gives the same events (data, offsets) however the stream is
  chunked; the relay forwards every byte once, in order; assembled text is valid Unicode
- ``decode_body``: only EncodingError; never more than the cap
- ``config``: YAML text -> `_load_yaml` + `parse_config`: a Config or a ConfigError, nothing else
- ``paths``: ``is_chat_path`` never raises; ``normalize_path`` is idempotent

    .venv/bin/python -m bench.fuzz --inputs 1000000          # writes bench/results/fuzz.md + .json
    .venv/bin/python -m bench.fuzz --inputs 20000 --out /tmp/fuzz.md   # a quick look
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
import traceback
import zlib
from collections import Counter
from typing import Any, Callable

import yaml

from bench.common import RESULTS, command, git_commit, machine, write_results
from extproc.config import Config, ConfigError, parse_config
from extproc.config.load import _load_yaml
from extproc.protocol.encoding import EncodingError, decode_body
from extproc.protocol.openai import ProtocolError, append_to_choices, parse_chat_request, parse_chat_response
from extproc.protocol.paths import is_chat_path, normalize_path
from extproc.protocol.sse import ChatStreamRelay, SSEParser

try:
    import brotli
except ImportError:  # br inputs are then only random bytes (decode_body reports br unsupported)
    brotli = None

FIELD = "truthlens_context"
NASTY = ["\ud800", "\udfff", "\udbff\udc00", "\x00", "\ufeff", "\u2028", "\r", "\n", "é", "😀", "\\", '"', " "]
WORDS = ["user", "system", "developer", "tool", "function", "assistant", "text", "image_url", "content", "role",
         "messages", "choices", "message", "index", "model", "id", FIELD, "tools", "stream", "delta", "refusal"]


class Gen:
    """Random JSON-like values, texts and byte mutations."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def text(self, n: int = 8) -> str:
        r = self.r
        return "".join(r.choice(NASTY) if r.random() < 0.3 else r.choice(WORDS) if r.random() < 0.3
                       else chr(r.randrange(32, 0x250)) for _ in range(r.randrange(n + 1)))

    def scalar(self) -> Any:
        r = self.r
        k = r.randrange(7)
        return (None, True, r.randrange(-5, 5), r.choice([2**70, -2**64, 1.5, 1e308, 0.0]), self.text(),
                r.choice(WORDS), "")[k]

    def value(self, depth: int = 3) -> Any:
        r = self.r
        if depth <= 0 or r.random() < 0.45:
            return self.scalar()
        if r.random() < 0.5:
            return [self.value(depth - 1) for _ in range(r.randrange(4))]
        return {self.key(): self.value(depth - 1) for _ in range(r.randrange(4))}

    def key(self) -> str:
        return self.r.choice(WORDS) if self.r.random() < 0.7 else self.text(4)

    def content(self) -> Any:
        r = self.r
        k = r.randrange(5)
        if k == 0:
            return self.text(30)
        if k == 1:
            return [r.choice([self.text(10), {"type": r.choice(["text", "input_text", "image_url", "refusal"]),
                                               "text": self.text(10), "refusal": self.text(5)}, self.value(1)])
                    for _ in range(r.randrange(4))]
        return self.value(2) if k == 2 else None if k == 3 else self.text(5)

    def request(self) -> dict[str, Any]:
        r = self.r
        obj: dict[str, Any] = {"model": self.scalar() if r.random() < 0.3 else "gpt"}
        if r.random() < 0.9:
            obj["messages"] = ([{"role": r.choice(WORDS[:6] + [3, None]), "content": self.content()}
                                for _ in range(r.randrange(5))] if r.random() < 0.85 else self.value(2))
        if r.random() < 0.6:
            k = r.randrange(4)
            obj[FIELD] = (self.text(20) if k == 0 else [r.choice([self.text(10), {"text": self.content()},
                                                                   {"content": self.content()}, self.value(1)])
                                                         for _ in range(r.randrange(4))] if k == 1 else self.value(2))
        if r.random() < 0.3:
            obj[self.key()] = self.value(2)
        return obj

    def response(self) -> dict[str, Any]:
        r = self.r
        obj: dict[str, Any] = {"id": self.scalar() if r.random() < 0.3 else "chatcmpl-1", "model": self.scalar()}
        if r.random() < 0.9:
            obj["choices"] = [{"index": r.choice([i, i, self.scalar()]),
                               "message": {"role": "assistant", "content": self.content()} if r.random() < 0.9
                               else self.value(1), "finish_reason": self.scalar()}
                              for i in range(r.randrange(4))] if r.random() < 0.9 else self.value(2)
        else:
            obj["error"] = self.value(1)
        return obj

    def encode(self, obj: Any) -> bytes:
        """JSON bytes: ASCII escapes (how lone surrogates travel) or UTF-8 (surrogates escaped by hand)."""
        if self.r.random() < 0.5:
            return json.dumps(obj, ensure_ascii=True).encode()
        text = json.dumps(obj, ensure_ascii=False)
        return text.encode("utf-8", "backslashreplace").replace(b"\\x", b"\\u00") if self.r.random() < 0.1 \
            else text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()

    def mutate(self, data: bytes) -> bytes:
        r = self.r
        for _ in range(r.randrange(1, 4)):
            k = r.randrange(7)
            i = r.randrange(len(data) + 1)
            if k == 0:
                data = data[:i]
            elif k == 1 and data:
                j = min(len(data) - 1, i)
                data = data[:j] + bytes([r.randrange(256)]) + data[j + 1:]
            elif k == 2:
                data = data[:i] + r.choice([b"\\ud800", b"\\uDFFF", b"\\u0000", b'"', b"{", b"]", b"\xff", b"\xed\xa0\x80",
                                            b"\xef\xbb\xbf", b"NaN", b",", b"\\"]) + data[i:]
            elif k == 3:
                data = data[:i] + data[i:i + r.randrange(20)] * 2 + data[i + 20:]
            elif k == 4 and r.random() < 0.2:
                data = data.decode("latin-1").encode("utf-16")
            elif k == 5:
                data = r.randbytes(r.randrange(40))
            else:
                data = data.replace(b"\\u", b"\\uD8", 1)
        return data

    def body(self, obj: Any) -> bytes:
        data = self.encode(obj)
        return self.mutate(data) if self.r.random() < 0.35 else data


def _valid(*texts: Any) -> None:
    for t in texts:
        if t is not None:
            t.encode("utf-8")


def check_request(g: Gen) -> None:
    body = g.body(g.request())
    field = FIELD if g.r.random() < 0.9 else None
    try:
        chat = parse_chat_request(body, field)
    except ProtocolError as exc:
        if exc.upstream_body is not None:
            assert FIELD not in json.loads(exc.upstream_body), "forwarded the RAG field"
        return
    _valid(chat.question, chat.system_prompt, *chat.context)
    if chat.upstream_body is not None:
        assert FIELD not in json.loads(chat.upstream_body), "forwarded the RAG field"


def check_response(g: Gen) -> None:
    body = g.body(g.response())
    try:
        resp = parse_chat_response(body)
    except ProtocolError:
        return
    _valid(resp.id, resp.model, *resp.answers)


def check_append(g: Gen) -> None:
    body = g.body(g.response())
    text: Any = g.text(10) if g.r.random() < 0.7 else {g.r.randrange(4): g.text(5) for _ in range(2)}
    try:
        out = append_to_choices(body, text)
    except ProtocolError:
        return
    json.loads(out)


SSE_PIECES = [b"data: ", b"data:", b"event: x", b"id: 1", b"id: \x00", b"retry: 5", b": c", b"\r\n", b"\n", b"\r",
              b"\n\n", b"\r\n\r\n", b"[DONE]", b"\xef\xbb\xbf", b"\xff", b"\xe2\x82", b"\xac"]


def sse_stream(g: Gen) -> bytes:
    r = g.r
    out = []
    for _ in range(r.randrange(12)):
        if r.random() < 0.4:
            chunk = {"id": g.scalar(), "choices": [{"index": r.choice([0, 1, g.scalar()]),
                                                     "delta": {"content": g.text(6)}}]}
            out.append(b"data: " + g.encode(chunk) + r.choice([b"\n\n", b"\r\n\r\n", b"\r\r", b"\n"]))
        else:
            out.append(r.choice(SSE_PIECES))
    return b"".join(out)


def _events(p: SSEParser, pieces: list[bytes]) -> list[tuple[Any, ...]]:
    evs = []
    for piece in pieces:
        evs += p.feed(piece)
    evs += p.feed(b"")
    return [(e.data, e.event, e.id, e.start, e.end) for e in evs]


def check_sse(g: Gen) -> None:
    stream = sse_stream(g)
    r = g.r
    cuts = sorted({0, len(stream), *(r.randrange(len(stream) + 1) for _ in range(r.randrange(6)))})
    pieces = [stream[a:b] for a, b in zip(cuts, cuts[1:])]
    assert _events(SSEParser(), [stream]) == _events(SSEParser(), pieces), "events depend on chunking"
    relay = ChatStreamRelay(max_held=r.choice([1 << 20, r.randrange(1, 64)]))
    out = b"".join(relay.feed(p) for p in pieces) + relay.feed(b"") + relay.finish(b"")
    assert out == stream, "relay lost, added or reordered bytes"
    for i in relay.assembler.indices():
        _valid(relay.assembler.text(i))


def check_decode(g: Gen) -> None:
    r = g.r
    raw = r.randbytes(r.randrange(300)) if r.random() < 0.5 else bytes(r.randrange(5000))
    k = r.randrange(4)
    if k == 0:
        body, coding = gzip.compress(raw), r.choice(["gzip", "x-gzip"])
    elif k == 1:
        body, coding = zlib.compress(raw), "deflate"
    elif k == 2 and brotli is not None:
        body, coding = brotli.compress(raw, quality=1), "br"
    else:
        body, coding = r.randbytes(r.randrange(50)), r.choice(["gzip", "deflate", "br", "gzip, deflate", "zstd", ""])
    if r.random() < 0.3:
        body = g.mutate(body)
    cap = r.randrange(1, 6000)
    try:
        out = decode_body(body, coding, cap)
    except EncodingError:
        return
    assert len(out) <= cap, "over the cap"


CONFIG_KEYS = ["server", "truthlens", "telemetry", "decisions", "grpc_address", "metrics_address", "tls", "enabled",
               "thresholds", "token", "models", "modes", "standard", "premium", "verifiers", "name", "rules",
               "conditions", "type", "value", "plugins", "mode", "action", "priority", "max_body_bytes", "batching",
               "keepalive_time_s", "max_concurrent_streams", "grounding", "stream", "hold_back", "inference"]
YAML_PIECES = ["[]", "{}", ":", "- ", "? ", "&a ", "*a", "!!str ", "!!python/object:os.system ", "|", ">", "'", '"',
               "#", "\n", "  ", "\t", "2001-13-40", "0x1F", "1e999", ".nan", "~", "null", "yes", ",", "%YAML 1.1\n",
               "---\n", "..."]


def config_text(g: Gen) -> str:
    r = g.r
    if r.random() < 0.5:
        def val(d: int) -> Any:
            if d <= 0 or r.random() < 0.4:
                return r.choice([g.scalar(), r.choice(["auto", "cpu", "block", "warn", "standard", "premium",
                                                       "127.0.0.1:1", "unix:/x", "http://x", "{score}", ""])])
            if r.random() < 0.4:
                return [val(d - 1) for _ in range(r.randrange(3))]
            return {r.choice(CONFIG_KEYS) if r.random() < 0.8 else g.scalar(): val(d - 1) for _ in range(r.randrange(4))}

        try:
            text = yaml.safe_dump({r.choice(CONFIG_KEYS[:4]): val(4) for _ in range(r.randrange(4))},
                                  allow_unicode=True)
        except yaml.YAMLError:
            text = ""
        if r.random() < 0.4:
            i = r.randrange(len(text) + 1)
            text = text[:i] + r.choice(YAML_PIECES) + text[i:]
        return text
    return "".join(r.choice(YAML_PIECES + CONFIG_KEYS) for _ in range(r.randrange(12)))


def check_config(g: Gen) -> None:
    text = config_text(g)
    try:
        cfg = parse_config(_load_yaml(text, "fuzz.yaml"), "fuzz.yaml")
    except ConfigError as exc:
        assert exc.errors and all(isinstance(e, str) for e in exc.errors), "empty ConfigError"
        return
    assert isinstance(cfg, Config)


def check_paths(g: Gen) -> None:
    r = g.r
    path = "".join(r.choice(["/", "//", ".", "..", "v1", "V1", "chat", "CHAT", "completions", "%2F", "%2f", "%25",
                             "%63", ";x", "?q=1", "#f", "\\", "%", "%zz", "models", "é"]) for _ in range(r.randrange(10)))
    is_chat_path(path)
    once = normalize_path(path)
    assert normalize_path(once) == once or "%" in once, "normalize_path is not idempotent"


TARGETS: dict[str, tuple[Callable[[Gen], None], int]] = {  # name -> (check, weight)
    "parse_chat_request": (check_request, 5),
    "parse_chat_response": (check_response, 3),
    "append_to_choices": (check_append, 2),
    "sse": (check_sse, 3),
    "decode_body": (check_decode, 2),
    "config": (check_config, 3),
    "paths": (check_paths, 2),
}


def run(inputs: int, seed: int, progress: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    g = Gen(rng)
    names = [n for n, (_, w) in TARGETS.items() for _ in range(w)]
    counts: Counter[str] = Counter()
    crashes: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i in range(inputs):
        name = names[i % len(names)]
        state = rng.getstate() if len(samples) < 10 else None
        try:
            TARGETS[name][0](g)
        except Exception as exc:  # noqa: BLE001 - a crash is what this counts
            crashes[name] += 1
            if state is not None:
                samples.append({"target": name, "input_index": i, "error": repr(exc)[:300],
                                "where": traceback.format_exc(limit=-2)[-600:]})
        counts[name] += 1
        if progress and i and i % 100_000 == 0:
            print(f"{i} inputs, {sum(crashes.values())} crashes, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return {"inputs": inputs, "seed": seed, "seconds": round(time.perf_counter() - t0, 1), "per_target": dict(counts),
            "crashes": dict(crashes), "crash_total": sum(crashes.values()), "samples": samples,
            "brotli": brotli is not None}


def report(r: dict[str, Any], cmd: str, machine_line: str) -> str:
    rows = "\n".join(f"| `{n}` | {r['per_target'].get(n, 0):,} | {r['crashes'].get(n, 0)} |" for n in TARGETS)
    samples = "\n".join(f"- `{s['target']}` input {s['input_index']}: `{s['error']}`" for s in r["samples"]) or "none"
    return f"""# Fuzz run: hostile-input contracts (#19)

Command: `{cmd}`
Machine: {machine_line}
Commit: {git_commit()}; seed {r['seed']}; brotli module {'installed' if r['brotli'] else 'absent (br inputs are random bytes)'}

**{r['inputs']:,} inputs, {r['crash_total']} crashes**, {r['seconds']:,} s ({r['inputs'] / max(r['seconds'], 1e-9):,.0f} inputs/s).

| target | inputs | crashes |
|---|---|---|
{rows}

A crash is any exception a target's contract does not allow, or a broken invariant (see the module
docstring of `bench/fuzz.py`). Crash samples (first 10):

{samples}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", type=int, default=1_000_000, help="how many inputs, across all targets")
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--out", default=str(RESULTS / "fuzz.md"))
    p.add_argument("--progress", action="store_true", help="a line on stderr every 100,000 inputs")
    args = p.parse_args()
    machine_line = machine()  # the load average before the run
    r = run(args.inputs, args.seed, args.progress)
    cmd = command("bench.fuzz")
    r["command"], r["machine"] = cmd, machine_line
    write_results(args.out, report(r, cmd, machine_line), r)
    print(f"{r['inputs']} inputs, {r['crash_total']} crashes, {r['seconds']} s -> {args.out}")
    return 1 if r["crash_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
