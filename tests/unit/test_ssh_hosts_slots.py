"""The copies of the SSH test network (tests/infra/ssh_hosts.py): each test run, and each
pytest-xdist worker of one, has a copy no other run or worker uses, and every interface name
fits Linux's 15 characters, the benchmarks' longer prefix included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra import ssh_hosts
from tests.infra.ssh_hosts import SSHTestHosts, slot_port, worker_slot

WORKERS = [f"gw{n}" for n in range(10)]


def test_no_two_runs_or_workers_share_a_copy() -> None:
    serial = {worker_slot(base, None) for base in range(10)}
    parallel = [worker_slot(base, w) for base in range(10) for w in WORKERS]
    assert serial == set(range(10))
    assert len(set(parallel)) == len(parallel) == 100
    assert not serial & set(parallel)
    assert max(parallel) <= 255  # the third byte of 10.213.SLOT.0/24
    assert worker_slot(7, "gw2") == 172


def test_copies_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 10 workers"):
        worker_slot(7, "gw10")
    with pytest.raises(ValueError, match="base slot of 0-9"):
        worker_slot(12, "gw0")
    with pytest.raises(ValueError, match="0-255"):
        worker_slot(256, None)


@pytest.mark.parametrize("prefix", ["dpssh", "dpbench"])  # the benchmarks' (fanout_hosts.py)
@pytest.mark.parametrize("slot", [0, 9, 109, 199])
def test_every_link_name_fits_and_none_is_another_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, prefix: str, slot: int
) -> None:
    monkeypatch.setattr(ssh_hosts, "PREFIX", f"{prefix}{slot or ''}-")
    monkeypatch.setattr(ssh_hosts, "SUBNET", f"10.213.{slot}")
    names = tuple(f"b{i}" for i in range(1, 51))  # benchmarks/watch_scale.py's 50 hosts
    hosts = SSHTestHosts(tmp_path, names=names).hosts.values()
    veths = [host.veth for host in hosts]
    assert all(len(name) <= 15 for name in veths), veths
    assert len(set(veths)) == len(veths)
    assert all(name.startswith(f"v{ssh_hosts.PREFIX}") for name in veths)  # found by prefix
    assert len(f"br-{prefix}{slot}") <= 15


def test_each_copy_has_ports_of_its_own() -> None:
    assert 20000 <= slot_port(0) < slot_port(9) < 32768  # below the ephemeral range
    with pytest.raises(ValueError):
        slot_port(10)
