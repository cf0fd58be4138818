"""Bandwidth probes on a real SSH fleet: agents in network namespaces send to each other over
the hosts' own network (10.213.k.0/24). Fleet apply measures one pair per host, all at once;
`dstack fleet probe` every pair; the matrix lands in state, `fleet list --json`, refreshes and
watch's metrics, and gangs are placed on it (links not measured are estimated)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import agents_running, write_fleet
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


@pytest.fixture
def remote(tmp_path: Path, cli_env: dict[str, str]) -> Path:
    cli_env["HOME"] = str(tmp_path / "home")
    cli_env["DSTACK_PLAN_SSH_AGENT_DIR"] = str(tmp_path / "remote")
    return tmp_path / "remote"


def test_fleet_probe_measures_every_pair_and_records_it(
    dstack: Dstack, tmp_path: Path, ssh_hosts: SSHTestHosts, remote: Path
) -> None:
    h1, h2, h3 = (ssh_hosts[n].address for n in ("h1", "h2", "h3"))
    write_fleet(tmp_path / "project", ssh_hosts, "h1", "h2", "h3")
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        # apply measured a linear number of pairs: ceil(3 / 2), every host in one
        by_apply = links_of(dstack)
        assert len(by_apply) == 2 and {h for pair in by_apply for h in pair} == {h1, h2, h3}
        assert all(rate for rate in by_apply.values()), by_apply
        ssh_hosts.cut_off("h3")  # no SSH to h3: its pairs are unknown, the command succeeds
        try:
            probed = dstack("fleet", "probe", "onprem", "--seconds", "0.5", "--json")
        finally:
            ssh_hosts.start("h3")
        assert probed.returncode == 0, probed.stdout + probed.stderr
        links = {(x["src"], x["dst"]): x for x in json.loads(probed.stdout)["bandwidth"]["links"]}
        assert set(links) == {(h1, h2), (h1, h3), (h2, h3)}
        fast = links[(h1, h2)]
        assert fast["error"] is None and fast["bytes_per_second"] > 0 and fast["bytes"] > 0
        assert fast["sent_bytes_per_second"] > 0
        print(f"\n{h1} -> {h2}: {fast['bytes_per_second'] / 1e9:.2f} GB/s")
        for pair in ((h1, h3), (h2, h3)):
            assert links[pair]["bytes_per_second"] is None and h3 in links[pair]["error"]

        listed = dstack("fleet", "list", "onprem", "--json")
        assert listed.returncode == 0, listed.stderr
        recorded = json.loads(listed.stdout)["fleets"][0]["bandwidth"]
        assert recorded["measured_at"] and recorded["seconds"] == 0.5
        # merged pair by pair: every pair probed again takes its new link, failed or not
        merged = {tuple(sorted((x["src"], x["dst"]))): x for x in recorded["links"]}
        assert set(merged) == {(h1, h2), (h1, h3), (h2, h3)}
        assert merged[(h1, h2)]["bytes_per_second"] == fast["bytes_per_second"]
        assert merged[(h1, h3)]["bytes_per_second"] is None
        assert all(x["measured_at"] for x in recorded["links"])

        # a refresh (plan) keeps the matrix: it is a fact of the hosts, not of the last check
        assert dstack("plan", "--detailed-exitcode").returncode == 0
        human = dstack("fleet", "probe", "onprem", "--seconds", "0.2")
        assert human.returncode == 0, human.stdout + human.stderr
        assert "GB/s" in human.stdout and "Recorded in fleet.onprem" in human.stdout
        out = tmp_path / "metrics.prom"
        ticked = dstack("watch", "--once", "--metrics-file", str(out))
        assert ticked.returncode == 0, ticked.stdout + ticked.stderr
        samples = {
            (s.labels["src"], s.labels["dst"]): s.value
            for family in text_string_to_metric_families(out.read_text())
            for s in family.samples
            if s.name == "dstack_host_bandwidth_bytes_per_second"
        }
        assert set(samples) == {(h1, h2), (h1, h3), (h2, h3)}  # h3 answers again
        assert all(v > 0 for v in samples.values())
        assert json.loads(dstack("fleet", "list", "--json").stdout)["fleets"][0]["bandwidth"]
    finally:
        assert dstack("destroy", "-y").returncode == 0
    assert agents_running(remote) == set()


def test_fleet_apply_measures_one_pair_per_host_and_a_gang_takes_the_faster_pair(
    dstack: Dstack, tmp_path: Path, ssh_hosts: SSHTestHosts, remote: Path
) -> None:
    """h1 sits behind a slow link: the apply that creates the fleet of four measures two
    pairs at once (h1-h2 and h3-gpu, not all six), and the two-node task applied with it
    goes to h3 and gpu, not to h1 and h2 (which packing alone picks). A host added later is
    probed against one existing host, the best-linked."""
    h1, h2, h3, gpu = (ssh_hosts[n].address for n in ("h1", "h2", "h3", "gpu"))
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h1", "h2", "h3", "gpu")
    fleet = project / "fleet.dstack.yml"

    def cluster() -> None:
        fleet.write_text(
            fleet.read_text().replace("name: onprem\n", "name: onprem\nplacement: cluster\n")
        )

    cluster()
    ssh_hosts.throttle("h1", 40)
    try:
        started = time.monotonic()
        applied = dstack("apply", "-y", "--target", "fleet.onprem")
        print(f"\nfleet of 4 applied in {time.monotonic() - started:.1f}s")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        links = links_of(dstack)
        assert set(links) == {(h1, h2), (h3, gpu)}, links  # one round: linear, not all pairs
        assert all(rate for rate in links.values()), links
        assert links[(h3, gpu)] > 3 * links[(h1, h2)], links
        (project / "pair.dstack.yml").write_text(
            "type: task\nname: pair\nfleets: [onprem]\nnodes: 2\ncommands: [hostname]\n"
        )
        planned = dstack("plan", "--json")
        assert planned.returncode == 0, planned.stderr
        changes = json.loads(planned.stdout)["resource_changes"]
        pair = next(c for c in changes if c["address"] == "task.pair")
        assert sorted(pair["placement"]["hosts"]) == sorted([h3, gpu]), pair
        ran = dstack("apply", "-y")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        jobs = state(project)["resources"]["task.pair"]["attributes"]["jobs"]
        assert sorted(j["host"] for j in jobs) == sorted([h3, gpu])

        # a host added: one pair more, against a host of the fast pair; the rest is kept
        gpu2 = ssh_hosts["gpu2"].address
        write_fleet(project, ssh_hosts, "h1", "h2", "h3", "gpu", "gpu2")
        cluster()
        added = dstack("apply", "-y", "--target", "fleet.onprem")
        assert added.returncode == 0, added.stdout + added.stderr
        grown = links_of(dstack)
        new = {pair: rate for pair, rate in grown.items() if pair not in links}
        assert len(new) == 1 and all(rate for rate in new.values()), grown
        (src, dst), _ = next(iter(new.items()))
        assert dst == gpu2 and src in {h3, gpu}, grown
        assert {pair: grown[pair] for pair in links} == links
    finally:
        ssh_hosts.throttle("h1", None)
        assert dstack("destroy", "-y").returncode == 0
    assert agents_running(remote) == set()


def links_of(dstack: Dstack) -> dict[tuple[str, str], float | None]:
    """(src, dst) -> bytes per second of every link fleet.onprem records."""
    listed = dstack("fleet", "list", "onprem", "--json")
    assert listed.returncode == 0, listed.stderr
    return {
        (x["src"], x["dst"]): x["bytes_per_second"]
        for x in json.loads(listed.stdout)["fleets"][0]["bandwidth"]["links"]
    }
