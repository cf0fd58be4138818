"""Whole-process time of `dstack plan` with 3 cloud fleets and of `dstack offer --gpu A100`.

EC2 is moto's server on 127.0.0.1 (boto3 reaches it through `AWS_ENDPOINT_URL`), optionally
behind a TCP proxy adding a one-way delay to every chunk (`--latency-ms`, default 40: a 80 ms
round trip, about what an EC2 regional endpoint is from a nearby machine), so the calls a plan
makes cost what they would. The backend lists no `regions`, so every region of the shipped
catalogue is asked (`describe_instance_type_offerings`, once per region per command). The 3
fleets ask for an A100 node (spot_policy auto), an A10G node and a CPU node.

The first run of each command is "cold": a fresh bytecode cache and nothing asked before. The
median of the next N is "warm" (bytecode cached, page cache warm). There is no offer cache yet
(each command asks EC2 again): warm is what a second command pays today. Target: a plan with
cloud fleets under 1 s warm.

Competitors, when they run offline: SkyPilot's `sky show-gpus A100` and dstack 0.22.5's offer
listing. Neither can here: SkyPilot is not in the package index this machine installs from, and
dstack's `dstack offer` needs a running dstack server with a configured backend that calls the
real clouds (its gpuhunt catalogues are downloaded at run time). The table says so.

    python benchmarks/cloud_plan.py [-n 5] [--latency-ms 40]
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_PLAN_S = 1.0
FLEETS = """\
type: fleet
name: a100
nodes: 1
backends: [aws]
spot_policy: auto
resources: {gpu: "A100:8"}
---
type: fleet
name: a10g
nodes: 2
backends: [aws]
resources: {gpu: "A10G:1", memory: 16GB..}
---
type: fleet
name: cpu
nodes: 3
backends: [aws]
resources: {cpu: 8.., memory: 32GB..}
"""
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
NOT_RUN = {
    "sky show-gpus A100 (SkyPilot)": "not installable offline (not in the package index)",
    "dstack offer --gpu A100 (dstack 0.22.5)": (
        "needs a dstack server with a real cloud backend (gpuhunt downloads its catalogues)"
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ec2(latency_ms: float) -> tuple[str, list[subprocess.Popen[bytes]], object]:
    """moto's server, and the delay proxy in front of it when `latency_ms` > 0: the URL to use."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    if latency_ms <= 0:
        return f"http://{host}:{port}", [], server
    listen = free_port()
    proxy = Path(__file__).resolve().parents[1] / "scripts" / "delayproxy.py"
    spec = f"127.0.0.1:{listen}=127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, str(proxy), str(latency_ms), spec])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", listen), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return f"http://127.0.0.1:{listen}", [proc], server


def timed(argv: list[str], cwd: Path, env: dict[str, str], expect: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        raise SystemExit(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=5, help="warm runs of each command")
    parser.add_argument("--latency-ms", type=float, default=40.0, help="one-way delay to EC2")
    args = parser.parse_args()
    script = Path(sys.executable).parent / "dstack"
    url, procs, server = start_ec2(args.latency_ms)
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            project = tmp / "project"
            (project / ".dstack").mkdir(parents=True)
            (project / ".dstack" / "backends.yml").write_text("backends:\n  - type: aws\n")
            (project / "fleets.dstack.yml").write_text(FLEETS)
            env = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env.update(CREDENTIALS, NO_COLOR="1", COLUMNS="200", AWS_ENDPOINT_URL=url)
            env.update(DSTACK_PLAN_AGENT_DIR=str(tmp / "agent"))
            env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
            commands = {
                "dstack plan (3 cloud fleets)": (
                    [str(script), "plan"],
                    "Plan: 3 to add, 0 to change, 0 to destroy.",
                ),
                "dstack offer --gpu A100 --backend aws": (
                    [str(script), "offer", "--gpu", "A100", "--backend", "aws"],
                    "p4d.24xlarge",
                ),
            }
            rows = []
            for name, (argv, expect) in commands.items():
                cold = timed(argv, project, env, expect)
                warm = statistics.median(timed(argv, project, env, expect) for _ in range(args.n))
                rows.append((name, cold, warm))
    finally:
        for proc in procs:
            proc.terminate()
        server.stop()  # type: ignore[attr-defined]
    print(f"EC2: moto server, one-way latency {args.latency_ms:g} ms; warm = median of {args.n}")
    print(f"{'command':<42} {'cold s':>8} {'warm s':>8}  target")
    for name, cold, warm in rows:
        target = f"< {TARGET_PLAN_S:g} s warm" if name.startswith("dstack plan") else ""
        ok = "" if not target else ("  met" if warm < TARGET_PLAN_S else "  MISSED")
        print(f"{name:<42} {cold:>8.2f} {warm:>8.2f}  {target}{ok}")
    for name, why in NOT_RUN.items():
        print(f"{name:<42} {'-':>8} {'-':>8}  not run: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
