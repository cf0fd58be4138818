"""The agent's `dstack_agent_network_bytes_total`: /proc/net/dev summed over the host's own
interfaces, read from real files laid out as Linux lays them out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dstack_plan.agent.metrics import host_families, network_bytes, render

HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
)


def proc_net_dev(tmp_path: Path, counters: dict[str, tuple[int, int]]) -> Path:
    lines = [
        f"{name:>6}: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0"
        for name, (rx, tx) in counters.items()
    ]
    path = tmp_path / "net_dev"
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return path


def sysfs(tmp_path: Path, interfaces: dict[str, tuple[str, bool, bool]]) -> Path:
    """/sys/class/net: name -> (device kind `physical|virtual`, is a bridge, is a bridge port);
    each entry a symlink into /sys/devices as on Linux."""
    net = tmp_path / "sys" / "class" / "net"
    net.mkdir(parents=True)
    for name, (kind, bridge, port) in interfaces.items():
        where = "devices/virtual/net" if kind == "virtual" else "devices/pci0000:00/net"
        device = tmp_path / "sys" / where / name
        device.mkdir(parents=True)
        (device / "type").write_text("772\n" if name == "lo" else "1\n")
        if bridge:
            (device / "bridge").mkdir()
        if port:
            (device / "brport").mkdir()
        (net / name).symlink_to(device)
    return net


def test_only_the_hosts_own_interfaces_count_so_container_traffic_counts_once(
    tmp_path: Path,
) -> None:
    counters = {
        "lo": (1_000_000, 1_000_000),
        "eth0": (100, 10),  # the NIC: counted
        "eth1": (20, 2),  # a second NIC, enslaved to br0 (a hypervisor set-up): counted
        "br0": (20, 2),  # ... its bridge: a copy of eth1's traffic
        "docker0": (5_000, 5_000),  # docker's bridge: copies of the containers' traffic
        "veth1a2b": (5_000, 5_000),  # a container's host-side end, a port of docker0
        "wg0": (3, 1),  # a tunnel: virtual but no bridge port, its own traffic
        "ifb0": (7_000, 7_000),  # a shaping mirror of another interface
    }
    interfaces = {
        "lo": ("virtual", False, False),
        "eth0": ("physical", False, False),
        "eth1": ("physical", False, True),
        "br0": ("virtual", True, False),
        "docker0": ("virtual", True, False),
        "veth1a2b": ("virtual", False, True),
        "wg0": ("virtual", False, False),
        "ifb0": ("virtual", False, False),
    }
    found = network_bytes(proc_net_dev(tmp_path, counters), sysfs(tmp_path, interfaces))
    assert found == {"rx": 123, "tx": 13}


def test_without_sysfs_only_loopback_and_mirrors_are_left_out(tmp_path: Path) -> None:
    counters = {"lo": (9, 9), "eth0": (100, 10), "ifb0": (50, 50), "eth1": (1, 1)}
    found = network_bytes(proc_net_dev(tmp_path, counters), tmp_path / "no-sysfs")
    assert found == {"rx": 101, "tx": 11}


def test_names_stuck_to_their_counters_parse_too(tmp_path: Path) -> None:
    path = tmp_path / "net_dev"
    path.write_text(HEADER + "eth0:4294967296 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n")
    assert network_bytes(path, tmp_path) == {"rx": 4294967296, "tx": 7}


def test_no_proc_net_dev_means_no_network_family(tmp_path: Path) -> None:
    assert network_bytes(tmp_path / "missing", tmp_path) == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/dev")
def test_the_agents_exposition_carries_rx_and_tx_counters_of_this_machine() -> None:
    text = render(host_families(1.0, {}, [], {}, []))
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "dstack_agent_network_bytes"  # the parser strips a counter's _total
    ]
    assert family.type == "counter"
    samples = {s.labels["direction"]: s.value for s in family.samples}
    assert set(samples) == {"rx", "tx"} and all(v >= 0 for v in samples.values())
