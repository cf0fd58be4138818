"""Which idle cloud machines watch releases, and when (never below `nodes.min`)."""

from __future__ import annotations

from dstack_plan.fleets.cloud_records import CloudInstance
from dstack_plan.fleets.idle import burst_idle, idle_limit
from dstack_plan.watch.idle_machines import releasable


def machine(n: int, since: float | None = None, idle: int | str | None = None) -> CloudInstance:
    return CloudInstance(
        id=f"i-{n}",
        provider="aws",
        name=f"f-{n}",
        region="us-east-1",
        instance_type="g5.xlarge",
        hostname=f"10.0.0.{n}",
        status="idle",
        idle_since=since,
        idle_duration=idle,  # type: ignore[arg-type]
    )


def test_idle_time_counts_from_when_watch_first_sees_the_machine_idle() -> None:
    seen, due = releasable([machine(1)], busy=set(), now=100.0, floor=0, fleet_idle=60)
    assert seen[0].idle_since == 100.0 and due == []
    seen, due = releasable(seen, busy=set(), now=159.0, floor=0, fleet_idle=60)
    assert due == []
    seen, due = releasable(seen, busy=set(), now=160.0, floor=0, fleet_idle=60)
    assert [m.id for m in due] == ["i-1"]


def test_a_job_on_the_machine_resets_its_idle_time() -> None:
    seen, due = releasable([machine(1, since=0.0)], {"10.0.0.1"}, 1000.0, 0, 60)
    assert seen[0].idle_since is None and due == []


def test_a_fixed_size_fleet_never_shrinks_and_the_longest_idle_go_first() -> None:
    three = [machine(1, since=50.0), machine(2, since=10.0), machine(3, since=30.0)]
    _, due = releasable(three, set(), 1000.0, floor=3, fleet_idle=60)
    assert due == []  # nodes.min 3: a terminate/recreate loop otherwise (dstack #3128)
    _, due = releasable(three, set(), 1000.0, floor=1, fleet_idle=60)
    assert [m.id for m in due] == ["i-2", "i-3"]


def test_a_burst_machine_keeps_the_shorter_duration_and_off_never_releases() -> None:
    assert burst_idle(None, None) == 300  # the run's 5m beats the fleet's 3d
    assert burst_idle(3600, 7200) == 3600
    assert burst_idle("off", None) == 300
    assert burst_idle("off", "off") == "off"
    assert idle_limit(None, None) == 3 * 24 * 3600
    _, due = releasable([machine(1, since=0.0, idle="off")], set(), 1e9, 0, 60)
    assert due == []
    _, due = releasable([machine(1, since=0.0)], set(), 1e9, 0, "off")
    assert due == []
