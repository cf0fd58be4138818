"""A TCP proxy that delays every chunk by a fixed one-way latency, keeping order: a stand-in
for a network link to a distant API, for benchmarks (`benchmarks/cloud_plan.py`).

    python scripts/delayproxy.py ONE_WAY_MS LISTEN_HOST:PORT=TARGET_HOST:PORT [...]
"""

from __future__ import annotations

import asyncio
import sys
import time


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def send() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(receive(), send())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(delay: float, specs: list[str]) -> None:
    for spec in specs:
        listen, target = spec.split("=")
        listen_host, listen_port = listen.rsplit(":", 1)
        target_host, target_port = target.rsplit(":", 1)

        async def connect(
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            host: str = target_host,
            port: int = int(target_port),
        ) -> None:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
            await asyncio.gather(
                _pump(reader, upstream_writer, delay), _pump(upstream_reader, writer, delay)
            )

        await asyncio.start_server(connect, listen_host, int(listen_port))
    print("delayproxy up", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(float(sys.argv[1]) / 1000, sys.argv[2:]))
