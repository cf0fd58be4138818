"""Labels and locality on an SSH fleet: a run's `labels:` choose its host, `--label` (kept in
a saved plan) picks another, a label no host has makes the plan say why per host, and `near:`
prefers the host near a storage without excluding the others. Relabelling a host updates
the fleet in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import remote  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def fleet(hosts: SSHTestHosts, h2_labels: str = "{rack: r2, near: [nfs-a, nfs-b]}") -> str:
    return (
        "type: fleet\nname: onprem\nplacement: cluster\nssh_config:\n  user: root\n"
        f"  identity_file: {hosts.client_key}\n  hosts:\n"
        f"    - {{hostname: {hosts['h1'].address}, labels: {{rack: r1, zone: a}}}}\n"
        f"    - {{hostname: {hosts['h2'].address}, labels: {h2_labels}}}\n"
    )


def task(name: str, extra: str) -> str:
    return (
        f"type: task\nname: {name}\nfleets: [onprem]\ncommands: [hostname]\n"
        f"stop_duration: 1s\n{extra}"
    )


def placements(dstack: Dstack, *args: str) -> dict[str, list[str]]:
    planned = dstack("plan", "--json", *args)
    assert planned.returncode == 0, planned.stderr
    changes = json.loads(planned.stdout)["resource_changes"]
    return {c["address"]: c["placement"]["hosts"] for c in changes if c.get("placement")}


def test_labels_choose_hosts_and_near_prefers(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    h1, h2 = ssh_hosts["h1"].address, ssh_hosts["h2"].address
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts))
    # the fleet comes with the run: apply places it, by the same label rules
    (project / "pick.dstack.yml").write_text(task("pick", "labels: {rack: r2}\n"))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.pick", {"done"}, timeout=60)
    assert dstack("logs", "pick").stdout == "h2\n"
    assert placements(dstack)["task.pick"] == [h2]

    # --label overrides the file's rack for this invocation; a saved plan keeps it
    saved = dstack("plan", "--label", "rack=r1", "-out", "labelled.json")
    assert saved.returncode == 0, saved.stderr
    assert '~ labels.rack = "r2" -> "r1" # forces replacement' in saved.stdout
    assert f"on {h1}" in saved.stdout
    refused = dstack("apply", "labelled.json", "--label", "rack=r1")
    assert refused.returncode == 1 and "--label cannot be used with a saved plan" in (
        refused.stderr
    )
    applied = dstack("apply", "labelled.json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.pick", {"done"}, timeout=60)
    assert dstack("logs", "pick").stdout == "h1\n"
    assert state(project)["resources"]["task.pick"]["spec"]["labels"] == {"rack": "r1"}

    # a label no host has: the plan says, per host, what each has instead
    missing = dstack("plan", "--label", "rack=r9")
    assert missing.returncode == 1
    assert f"onprem ({h1}): lacks label rack=r9 (has rack=r1)" in missing.stderr
    assert f"onprem ({h2}): lacks label rack=r9 (has rack=r2)" in missing.stderr
    bad = dstack("plan", "--label", "rack")
    assert bad.returncode == 1 and "expected KEY=VALUE" in bad.stderr

    # near: a preference, not a requirement
    (project / "pick.dstack.yml").unlink()
    (project / "close.dstack.yml").write_text(task("close", "near: nfs-b\n"))
    (project / "nowhere.dstack.yml").write_text(task("nowhere", "near: nfs-z\n"))
    (project / "both.dstack.yml").write_text(task("both", "near: nfs-a\nnodes: 2\n"))
    placed = placements(dstack)
    assert placed["task.close"] == [h2]
    assert len(placed["task.nowhere"]) == 1
    assert sorted(placed["task.both"]) == sorted([h1, h2])

    # relabelling a host updates the fleet in place, and placement follows
    (project / "close.dstack.yml").unlink()
    (project / "nowhere.dstack.yml").unlink()
    (project / "both.dstack.yml").unlink()
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "{rack: r1, near: nfs-b}"))
    (project / "again.dstack.yml").write_text(task("again", "labels: {rack: r1}\n"))
    relabelled = dstack("plan")
    assert relabelled.returncode == 0, relabelled.stderr
    assert "forces replacement" not in relabelled.stdout
    applied = dstack("apply", "-y", "--target", "fleet.onprem")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert sorted(placements(dstack)["task.again"]) in ([h1], [h2])
    missing = dstack("plan", "--label", "rack=r3")
    assert f"onprem ({h2}): lacks label rack=r3 (has rack=r1)" in missing.stderr

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
