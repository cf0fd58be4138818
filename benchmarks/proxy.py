"""The service proxy's throughput, latency and memory, beside nginx, on loopback.

Two replicas (raw asyncio HTTP servers, each in its own process) answer `GET /` with a
13-byte body at once, and `GET /stream` with a chunk every 0.5 s for 10 s. A load generator
(its own process: an aiohttp client, N connections each sending one request after another for
a fixed time, after a warm-up) measures requests/s and latency against:
- replica a directly (the baseline of added latency);
- `ServiceProxy` (in its own process, so its RSS is measurable), over both replicas;
- nginx as a plain reverse proxy over both replicas (one worker, as the proxy has one
  process; `least_conn` and upstream keepalive, as the proxy does), configured into a temp
  dir; skipped, and said so, where nginx is not installed (`apt-get install nginx-light`).
The three alternate, `--rounds` times; medians are reported. Then 1,000 `/stream` requests
are held open through the proxy at once, and the proxy's RSS is read while they are.

    python benchmarks/proxy.py [--duration 5] [--rounds 3] [--connections 100] [--streams 1000]

Latency is also measured at 100 connections paced: each sends a request every 0.1 s (1,000
requests/s in all, a fraction of what any target serves), so that p99 is the time a request
takes, not its wait in a queue. Saturated, with each connection sending as fast as it can,
p99 is mostly queueing (100 requests in flight over a single-process server) and is
reported beside it.

Targets: proxy requests/s >= 0.3x nginx at 100 connections; p99 added latency < 10 ms at 100
connections (paced); 1,000 open streams < 200 MB RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATIO_TARGET = 0.3
ADDED_P99_TARGET_MS = 10.0
RSS_TARGET_MB = 200.0
BODY = b"hello, world\n"
STREAM_CHUNKS, STREAM_EVERY = 20, 0.5
PACED = -1
"""The results key of the paced run."""
PACED_INTERVAL = 0.1
"""Seconds between the requests of one connection in the paced run: 100 connections send
1,000 requests/s, well under what each target serves, so that p99 is latency, not a queue."""


# -- the roles, each run in its own process -------------------------------------------------


class _Replica(asyncio.Protocol):
    """HTTP/1.1 keep-alive, GET only: `/stream` streams chunks, anything else is BODY."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path.startswith(b"/stream"):
                asyncio.get_running_loop().create_task(self._stream())
            elif self.transport is not None:
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
                )

    async def _stream(self) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for n in range(STREAM_CHUNKS):
            if transport.is_closing():
                return
            data = b"data: %d\n\n" % n
            transport.write(b"%x\r\n%s\r\n" % (len(data), data))
            await asyncio.sleep(STREAM_EVERY)
        transport.write(b"0\r\n\r\n")


async def serve_replica(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        _Replica, "127.0.0.1", port, backlog=4096
    )
    print("ready", flush=True)
    await server.serve_forever()


async def serve_proxy(replica_ports: Sequence[int]) -> None:
    from dstack_plan.proxy import ProbeSettings, ServiceProxy, ServiceRoute, Upstream

    upstreams = [
        Upstream(replica_id=f"r{i}", url=f"http://127.0.0.1:{p}")
        for i, p in enumerate(replica_ports)
    ]
    route = ServiceRoute(name="bench", upstreams=upstreams, probe=ProbeSettings(interval=1))
    proxy = ServiceProxy([route])
    port = await proxy.start("127.0.0.1", 0)
    while len(proxy.healthy("bench")) < len(upstreams):
        await asyncio.sleep(0.05)
    print(port, flush=True)
    await asyncio.Event().wait()


async def load(
    url: str, connections: int, duration: float, warmup: float, interval: float = 0.0
) -> dict[str, Any]:
    """`connections` clients, each sending requests one after another: latencies after
    `warmup`, for `duration` seconds. With `interval`, each client sends one request every
    `interval` seconds instead (paced, below saturation: latency without a queue), its
    latency counted from when it was due, so that a slow answer is not hidden."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        measure_from, end = start + warmup, start + warmup + duration

        async def client(index: int) -> None:
            nonlocal errors
            due = start + interval * index / connections
            while True:
                if interval:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    sent, due = due, due + interval
                else:
                    sent = time.perf_counter()
                if sent >= end:
                    return
                try:
                    async with session.get(url) as response:
                        await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                done = time.perf_counter()
                if sent >= measure_from:
                    if ok:
                        latencies.append(done - sent)
                    else:
                        errors += 1

        await asyncio.gather(*(client(i) for i in range(connections)))
    latencies.sort()
    return {
        "rps": len(latencies) / duration,
        "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else float("nan"),
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else float("nan"),
        "errors": errors,
    }


async def streams(url: str, count: int) -> dict[str, Any]:
    """Open `count` streams at once; say `open` when every one got its first chunk, and
    report how many ended complete."""
    import aiohttp

    opened = 0
    all_open = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=count)
    timeout = aiohttp.ClientTimeout(total=STREAM_CHUNKS * STREAM_EVERY + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> bool:
            nonlocal opened
            async with session.get(url) as response:
                first = await response.content.readuntil(b"\n\n")
                opened += 1
                if opened == count:
                    all_open.set()
                rest = await response.read()
            return first.startswith(b"data: 0") and rest.count(b"data:") == STREAM_CHUNKS - 1

        started = time.perf_counter()
        tasks = [asyncio.ensure_future(one()) for _ in range(count)]
        await all_open.wait()
        print(f"open {time.perf_counter() - started:.3f}", flush=True)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    return {"complete": sum(r is True for r in results), "count": count}


# -- the orchestration ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def role(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream replicas {{
    least_conn;
    {servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def start_nginx(workdir: Path, replica_ports: Sequence[int]) -> tuple[subprocess.Popen[str], int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    servers = "\n    ".join(f"server 127.0.0.1:{p};" for p in replica_ports)
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, servers=servers, port=port))
    process = subprocess.Popen([nginx, "-p", str(workdir), "-c", str(conf)], text=True)
    wait_port(port)
    return process, port


def run_load(url: str, connections: int, duration: float, interval: float = 0.0) -> dict[str, Any]:
    args = ["load", url, str(connections), str(duration), str(interval)]
    out = subprocess.run(
        [sys.executable, __file__, "--role", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return dict(json.loads(out.stdout))


def measure_streams(proxy: subprocess.Popen[str], port: int, count: int) -> dict[str, Any]:
    idle = rss_mb(proxy.pid)
    client = role("streams", f"http://127.0.0.1:{port}/proxy/services/bench/stream", str(count))
    assert client.stdout is not None
    line = client.stdout.readline().split()
    opened_s = float(line[1]) if line and line[0] == "open" else float("nan")
    peak = rss_mb(proxy.pid)
    while client.poll() is None:
        peak = max(peak, rss_mb(proxy.pid))
        time.sleep(0.2)
    result = json.loads(client.stdout.read())
    return {"idle_mb": idle, "peak_mb": peak, "open_s": opened_s, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--streams", type=int, default=1000)
    args = parser.parse_args()

    processes: list[subprocess.Popen[str]] = []
    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    try:
        replica_ports = [free_port(), free_port()]
        for port in replica_ports:
            processes.append(role("replica", str(port)))
            assert processes[-1].stdout is not None
            processes[-1].stdout.readline()
        proxy = role("proxy", *map(str, replica_ports))
        processes.append(proxy)
        assert proxy.stdout is not None
        proxy_port = int(proxy.stdout.readline())
        targets = {
            "replica a, directly": f"http://127.0.0.1:{replica_ports[0]}/",
            "dstack proxy": f"http://127.0.0.1:{proxy_port}/proxy/services/bench/",
        }
        if shutil.which("nginx") or Path("/usr/sbin/nginx").exists():
            nginx, nginx_port = start_nginx(workdir, replica_ports)
            processes.append(nginx)
            targets["nginx"] = f"http://127.0.0.1:{nginx_port}/"
        else:
            print("nginx is not installed (apt-get install -y nginx-light): no nginx column")

        results: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds} ...", flush=True)
            for name, url in targets.items():
                for connections in (args.connections, 1):
                    duration = args.duration if connections > 1 else args.duration / 2
                    sample = run_load(url, connections, duration)
                    results.setdefault((name, connections), []).append(sample)
                paced = run_load(url, args.connections, args.duration, PACED_INTERVAL)
                results.setdefault((name, PACED), []).append(paced)

        def median(name: str, connections: int, key: str) -> float:
            return statistics.median(s[key] for s in results[(name, connections)])

        print(f"holding {args.streams} streams through the proxy ...", flush=True)
        held = measure_streams(proxy, proxy_port, args.streams)
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    c = args.connections
    print()
    header = ["target", f"req/s ({c} conn)", "p50 ms", "p99 ms", "p50 ms (1 conn)"]
    print("| " + " | ".join([*header, "p99 ms (1 conn)", "errors"]) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in targets:
        errors = sum(s["errors"] for k in ((name, c), (name, 1)) for s in results[k])
        print(
            f"| {name} | {median(name, c, 'rps'):,.0f} | {median(name, c, 'p50_ms'):.2f} "
            f"| {median(name, c, 'p99_ms'):.2f} | {median(name, 1, 'p50_ms'):.2f} "
            f"| {median(name, 1, 'p99_ms'):.2f} | {errors} |"
        )
    print()
    rate = c / PACED_INTERVAL
    print(f"| target | p50 ms ({c} conn, {rate:,.0f} req/s paced) | p99 ms | errors |")
    print("|---|---:|---:|---:|")
    for name in targets:
        errors = sum(s["errors"] for s in results[(name, PACED)])
        print(
            f"| {name} | {median(name, PACED, 'p50_ms'):.2f} "
            f"| {median(name, PACED, 'p99_ms'):.2f} | {errors} |"
        )
    direct, ours = "replica a, directly", "dstack proxy"
    added_one = median(ours, 1, "p99_ms") - median(direct, 1, "p99_ms")
    added_saturated = median(ours, c, "p99_ms") - median(direct, c, "p99_ms")
    added = median(ours, PACED, "p99_ms") - median(direct, PACED, "p99_ms")
    ratio = median(ours, c, "rps") / median("nginx", c, "rps") if "nginx" in targets else None
    print()
    shown = "n/a (no nginx)" if ratio is None else f"{ratio:.2f}x"
    print(f"- proxy / nginx requests/s at {c} connections: {shown}")
    print(
        f"- p99 added by the proxy vs the replica directly: {added:.2f} ms at {c} connections "
        f"paced ({rate:,.0f} req/s), {added_one:.2f} ms at 1 connection, "
        f"{added_saturated:.2f} ms at {c} connections saturated (a queue: see the docstring)"
    )
    print(
        f"- {held['count']} streams held open through the proxy: all open after "
        f"{held['open_s']:.2f} s, {held['complete']} complete; proxy RSS {held['idle_mb']:.0f} "
        f"MB idle, {held['peak_mb']:.0f} MB peak"
    )
    met = [
        ratio is None or ratio >= RATIO_TARGET,
        added < ADDED_P99_TARGET_MS,
        held["peak_mb"] < RSS_TARGET_MB and held["complete"] == held["count"],
    ]
    verdict = ["met" if m else "MISSED" for m in met]
    print(
        f"proxy: {'n/a' if ratio is None else f'{ratio:.2f}x'} nginx's requests/s (target >= "
        f"{RATIO_TARGET}x) {verdict[0]}, p99 added at {c} connections {added:.2f} ms (target < "
        f"{ADDED_P99_TARGET_MS:g} ms) {verdict[1]}, {held['count']} streams at "
        f"{held['peak_mb']:.0f} MB RSS (target < {RSS_TARGET_MB:g} MB) {verdict[2]}"
    )
    return 0 if all(met) else 1


def run_role(argv: Sequence[str]) -> None:
    name, *rest = argv
    if name == "replica":
        asyncio.run(serve_replica(int(rest[0])))
    elif name == "proxy":
        asyncio.run(serve_proxy([int(p) for p in rest]))
    elif name == "load":
        url, connections, duration, interval = rest
        loaded = load(url, int(connections), float(duration), 0.5, float(interval))
        print(json.dumps(asyncio.run(loaded)))
    elif name == "streams":
        print(json.dumps(asyncio.run(streams(rest[0], int(rest[1])))), flush=True)
    else:
        raise SystemExit(f"unknown role {name!r}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--role"]:
        try:
            run_role(sys.argv[2:])
        except KeyboardInterrupt:
            pass
        sys.exit(0)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
