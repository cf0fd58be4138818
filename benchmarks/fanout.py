"""Fan-out: `dstack exec -- uname -a` on 15 SSH hosts, against Ansible and a bare asyncssh loop.

    python benchmarks/fanout.py [-n 7] [--hosts 15]

Needs root (the hosts are network namespaces running sshd, made with the test fixture's code
from tests/infra/ssh_hosts.py, on their own bridge and subnet so a test run is not disturbed)
and ansible-core in the venv (`pip install ansible-core`). Each round runs, in turn:

- `dstack exec -- uname -a` (the console script, a project with one 15-host SSH fleet);
- `ansible all -m command -a 'uname -a'` (forks 15, pipelining on, the interpreter given so no
  discovery round trip; ControlPersist off, so like the others every run connects cold and no
  master connection outlives it);
- a bare asyncssh loop in a fresh `python -c` (the practical floor).

Every wall time includes the interpreter's start. Headline: exec's median against Ansible's
(target <= 0.25x) and against the floor (target <= 2x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.infra import ssh_hosts  # noqa: E402

# a network of its own: the test fixture's bridge, prefix and subnet stay untouched
ssh_hosts.BRIDGE = "br-dpbench"
ssh_hosts.PREFIX = "dpbench-"
ssh_hosts.SUBNET = "10.215.0"
ssh_hosts.INNER_NET = "10.216.0.0/24"

ANSIBLE_TARGET = 0.25
FLOOR_TARGET = 2.0
BIN = Path(sys.executable).parent

FLOOR = """
import asyncio, sys, asyncssh
async def one(host):
    async with asyncssh.connect(host, username="root", client_keys=[sys.argv[1]],
                                known_hosts=None, config=None, agent_path=None) as conn:
        return host, (await conn.run("uname -a", check=True)).stdout
async def main():
    for host, out in await asyncio.gather(*(one(h) for h in sys.argv[2:])):
        sys.stdout.write(f"{host} | {out}")
asyncio.run(main())
"""


def run(argv: list[str], env: dict[str, str], hosts: int, cwd: Path) -> float:
    """Wall seconds of one run; exits if it fails or does not print one `Linux` line a host."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    answered = sum(1 for line in done.stdout.splitlines() if "Linux" in line)
    if done.returncode != 0 or answered != hosts:
        sys.exit(f"{argv[0]} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def remove_leftover_links() -> None:
    """Delete host links a killed run left in the root namespace (they block `up()`)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"v{ssh_hosts.PREFIX}"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def write_project(directory: Path, key: Path, addresses: list[str]) -> Path:
    project = directory / "project"
    project.mkdir()
    hosts = "".join(f"    - {a}\n" for a in addresses)
    (project / "fleet.dstack.yml").write_text(
        f"type: fleet\nname: bench\nssh_config:\n  user: root\n  identity_file: {key}\n"
        f"  hosts:\n{hosts}"
    )
    return project


def write_ansible(directory: Path, key: Path, addresses: list[str], forks: int) -> Path:
    config = directory / "ansible.cfg"
    (directory / "inventory.ini").write_text(
        "[all]\n" + "".join(f"{a}\n" for a in addresses) + "\n[all:vars]\n"
        f"ansible_user=root\nansible_ssh_private_key_file={key}\n"
        "ansible_python_interpreter=/usr/bin/python3\n"
    )
    config.write_text(
        "[defaults]\n"
        f"inventory = {directory / 'inventory.ini'}\nforks = {forks}\n"
        "host_key_checking = False\ngathering = explicit\nretry_files_enabled = False\n"
        "[ssh_connection]\npipelining = True\n"
        "ssh_args = -C -o ControlMaster=auto -o ControlPersist=no\n"
    )
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--hosts", type=int, default=15, help="hosts (default 15)")
    args = parser.parse_args()
    reason = ssh_hosts.available()
    if reason is not None:
        sys.exit(f"cannot make the hosts: {reason}")
    ansible = BIN / "ansible"
    if not ansible.exists():
        sys.exit(f"{ansible} is missing: {BIN / 'pip'} install ansible-core")

    work = Path(tempfile.mkdtemp(prefix="dstack-fanout-"))
    names = tuple(f"b{i}" for i in range(1, args.hosts + 1))
    network = ssh_hosts.SSHTestHosts(work / "hosts", names=names)
    remove_leftover_links()
    try:
        network.up()
        addresses = [network[n].address for n in names]
        key = network.client_key
        project = write_project(work, key, addresses)
        config = write_ansible(work, key, addresses, args.hosts)
        home = work / "home"  # no ~/.ssh/known_hosts, no ~/.ansible of the user's
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "LC_ALL": "C.UTF-8"}
        env.pop("SSH_AUTH_SOCK", None)
        ansible_env = {**env, "ANSIBLE_CONFIG": str(config)}
        sides: dict[str, list[str]] = {
            "dstack exec": [str(BIN / "dstack"), "exec", str(project), "--", "uname", "-a"],
            "ansible -m command": [str(ansible), "all", "-m", "command", "-a", "uname -a"],
            "bare asyncssh": [sys.executable, "-c", FLOOR, str(key), *addresses],
        }
        times: dict[str, list[float]] = {side: [] for side in sides}
        for side, argv in sides.items():  # warm-up: page cache, .pyc files
            run(argv, ansible_env if side.startswith("ansible") else env, args.hosts, work)
        for _ in range(args.n):
            for side, argv in sides.items():
                side_env = ansible_env if side.startswith("ansible") else env
                times[side].append(run(argv, side_env, args.hosts, work))
    finally:
        network.down()
        remove_leftover_links()
        shutil.rmtree(work, ignore_errors=True)

    medians = {side: statistics.median(values) for side, values in times.items()}
    ansible_median, floor_median = medians["ansible -m command"], medians["bare asyncssh"]
    print(f"{args.hosts} hosts, `uname -a`, median of {args.n} alternating rounds")
    header = ("side", "median s", "min s", "max s", "x ansible", "x floor")
    print("{:<20} {:>9} {:>7} {:>7} {:>10} {:>8}".format(*header))
    for side, values in times.items():
        print(
            f"{side:<20} {medians[side]:>9.3f} {min(values):>7.3f} {max(values):>7.3f} "
            f"{medians[side] / ansible_median:>10.2f} {medians[side] / floor_median:>8.2f}"
        )
    exec_median = medians["dstack exec"]
    vs_ansible, vs_floor = exec_median / ansible_median, exec_median / floor_median
    ok = vs_ansible <= ANSIBLE_TARGET and vs_floor <= FLOOR_TARGET
    print(
        f"dstack exec on {args.hosts} hosts {exec_median:.3f} s: {vs_ansible:.2f}x Ansible "
        f"(target <= {ANSIBLE_TARGET}x), {vs_floor:.2f}x the asyncssh floor "
        f"(target <= {FLOOR_TARGET:g}x) -> {'OK' if ok else 'MISS'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
