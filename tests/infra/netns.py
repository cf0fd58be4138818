"""What the namespace test networks share (tests/infra/ssh_hosts.py, slurm_cluster.py): `ip`,
a bridge the hosts may forward across, host keys, and removing a network's namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path


def ip(*args: str, check: bool = True) -> None:
    """`ip ARGS...`, quietly."""
    subprocess.run(["ip", *args], check=check, capture_output=True)


def add_bridge(bridge: str, address: str) -> None:
    """Bridge `bridge` in the root namespace with `address` (`10.213.0.1/24`), forwarding
    between its hosts allowed."""
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", address, "dev", bridge)
    ip("link", "set", bridge, "up")
    forward_on_bridge(bridge, True)


def add_namespace(netns: str) -> None:
    """Network namespace `netns`, its loopback up."""
    ip("netns", "add", netns)
    ip("-n", netns, "link", "set", "lo", "up")


def plug(netns: str, veth: str, bridge: str, address: str) -> None:
    """`netns`'s `eth0` with `address` (`10.213.0.11/24`), linked to `bridge` through the
    root namespace's end `veth`."""
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", veth, "master", bridge, "up")
    ip("-n", netns, "addr", "add", address, "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")


def forward_on_bridge(bridge: str, allow: bool) -> None:
    """Let the hosts on `bridge` reach each other (bandwidth probes, multi-node runs, Slurm's
    daemons): where br_netfilter is loaded (dockerd loads it), bridged packets go through
    iptables' FORWARD chain, whose policy dockerd sets to DROP."""
    if shutil.which("iptables") is None:
        return
    rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    while subprocess.run(["iptables", "-D", *rule], capture_output=True).returncode == 0:
        pass  # leftovers of a killed run
    if allow:
        subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True)


def keygen(path: Path) -> None:
    """An ed25519 key pair at `path` (and `path.pub`), unless there is one."""
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)],
            check=True,
        )


def remove_network(prefix: str, veths: Iterable[str], bridge: str) -> None:
    """Kill every process in the namespaces named `prefix...` and delete them (a previous
    run's too), then the root namespace's ends of their links (`veths`) and `bridge`."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        netns = line.split()[0] if line.split() else ""
        if not netns.startswith(prefix):
            continue
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        ip("netns", "del", netns, check=False)
    # a namespace still held (by a socket closing, say) outlives `netns del` with its veth:
    # the next `up` could not add it again
    for veth in veths:
        ip("link", "del", veth, check=False)
    ip("link", "del", bridge, check=False)
    forward_on_bridge(bridge, False)
