"""`dstack fleet list` on how each host's agent runs (from state; no hosts needed)."""

from __future__ import annotations

from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.inspect.fleets import fleets_json, host_rows, reboot_note


def host(name: str, persistent: bool | None) -> HostRecord:
    return HostRecord(
        name=name, hostname=name, status="idle", agent_version="0.1.0", agent_persistent=persistent
    )


def test_the_agent_column_and_note_say_which_agents_will_not_survive_a_reboot() -> None:
    records = {
        "a": FleetRecord(hosts=(host("h1", False), host("h2", True))),
        "b": FleetRecord(hosts=(host("h3", False), host("old", None))),
    }
    assert [row[-1] for row in host_rows(records, {})] == [
        "0.1.0, detached",
        "0.1.0, systemd",
        "0.1.0, detached",
        "0.1.0",  # recorded before this was known
    ]
    assert reboot_note(records) == (
        "agent: detached on h1, h3 (will not survive a reboot; the next command that needs it "
        "starts it again)"
    )
    assert reboot_note({"a": FleetRecord(hosts=(host("h2", True),))}) is None
    hosts = fleets_json(records, {})["fleets"][0]["hosts"]
    assert [h["agent_persistent"] for h in hosts] == [False, True]


def test_a_record_from_before_reads_as_not_known() -> None:
    old = {"name": "h1", "hostname": "h1", "agent_version": "0.1.0"}
    assert HostRecord.model_validate(old).agent_persistent is None
