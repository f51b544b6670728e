"""A minimal asyncio OpenAI-style upstream for the gateway benchmark.

The demo upstream (stdlib http.server, a thread per connection) is right for demos and tests but
its own cost and jitter at concurrency 16 would drown the ext_proc differences the benchmark
measures. This one answers every POST with the same small chat.completion JSON from one event
loop: keep-alive, Content-Length bodies only. Benchmark use only.
"""

from __future__ import annotations

import argparse
import asyncio
import json

ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "The sea rolls in, grey and slow; the gulls call where the cold winds blow."}}],
}).encode()
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)) + ANSWER


DELAY_S = 0.0  # per answer: a stand-in for LLM generation time


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            if DELAY_S:
                await asyncio.sleep(DELAY_S)
            writer.write(RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=256)
    print(f"fast upstream on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--delay-ms", type=float, default=0.0, help="wait this long before each answer")
    args = p.parse_args()
    DELAY_S = args.delay_ms / 1000.0
    asyncio.run(main(args.port))
