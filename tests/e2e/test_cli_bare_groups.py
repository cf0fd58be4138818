"""dstack's habit: a command group given alone runs its listing (`dstack fleet` lists fleets,
`dstack export` lists exports), with the listing's options (`dstack fleet --json`); its
subcommands work as before, and `--help` still shows help."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.providers.base import MachineResources
from dstack_plan.state.model import ResourceState, State
from tests.e2e.conftest import Dstack


def _ok(done) -> str:  # noqa: ANN001 - CompletedProcess
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


def _with_a_fleet(dstack: Dstack) -> None:
    """The project's state holds SSH fleet `onprem` with one host, and no user to log in
    with: a listing that asks the hosts fails that one at once, never over the network."""
    host = HostRecord(
        name="10.0.0.1",
        hostname="10.0.0.1",
        status="idle",
        resources=MachineResources(cpus=8, memory_gb=64, disk_gb=100),
        agent_version="0.1.0",
    )
    fleet = ResourceState.create(
        "fleet.onprem",
        provider="ssh",
        spec={"name": "onprem", "ssh_config": {"hosts": [{"hostname": "10.0.0.1"}]}},
        now=datetime(2026, 1, 1, tzinfo=timezone.utc),
        status="active",
        attributes=FleetRecord(hosts=(host,)).to_attributes(),
    )
    _ok(dstack("state", "push", "-", stdin=State.empty().with_resource(fleet).to_json()))


def test_no_fleets_says_where_runs_go_instead_of_an_empty_table(dstack: Dstack) -> None:
    listed = _ok(dstack("fleet"))
    assert "FLEET" not in listed
    assert "No fleets." in listed and "built-in `local` fleet" in listed
    assert json.loads(_ok(dstack("fleet", "--json")))["fleets"] == []


def test_bare_fleet_lists_fleets_as_fleet_list_does(dstack: Dstack) -> None:
    _with_a_fleet(dstack)
    listed = _ok(dstack("fleet", "list"))
    assert "onprem" in listed and "10.0.0.1" in listed
    assert _ok(dstack("fleet")) == listed

    as_json = _ok(dstack("fleet", "--json"))
    assert as_json == _ok(dstack("fleet", "list", "--json"))
    [fleet] = json.loads(as_json)["fleets"]
    assert fleet["name"] == "onprem"

    shown = _ok(dstack("fleet", "--help"))
    assert "Commands:" in shown and "add-host" in shown and "onprem" not in shown


def test_bare_export_lists_exports_and_subcommands_still_work(
    dstack: Dstack, tmp_path: Path
) -> None:
    _with_a_fleet(dstack)
    assert _ok(dstack("export")) == "No exports.\n"
    assert json.loads(_ok(dstack("export", "--json"))) == []

    importer = f"ml={tmp_path}/ml/.dstack/state.json"
    _ok(dstack("export", "create", "share", "--fleet", "onprem", "--importer", importer))
    listed = _ok(dstack("export"))
    assert listed == _ok(dstack("export", "list")) and "share  onprem" in listed
    as_json = _ok(dstack("export", "--json"))
    assert as_json == _ok(dstack("export", "list", "--json"))
    assert [e["name"] for e in json.loads(as_json)] == ["share"]

    # an option of the bare group before a subcommand is refused, never dropped
    misplaced = dstack("export", "--json", "delete", "share")
    assert misplaced.returncode == 1
    assert "give it after the subcommand" in misplaced.stderr
    _ok(dstack("export", "delete", "share"))
    assert _ok(dstack("export")) == "No exports.\n"


def test_a_fleet_subcommand_still_works(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(
        "type: fleet\nname: onprem\nssh_config:\n  user: ubuntu\n  hosts:\n    - 10.0.0.1\n"
    )
    added = _ok(dstack("fleet", "add-host", "onprem", "ssh://ubuntu@10.0.0.2"))
    assert "Added {hostname: 10.0.0.2} to fleet.onprem" in added
    assert "10.0.0.2" in (project / "fleet.dstack.yml").read_text()
