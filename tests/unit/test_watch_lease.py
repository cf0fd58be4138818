"""The leader lease: one leader at a time, expiry, renewal, release, CAS on the record."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import StateError
from dstack_plan.state.backend import ABSENT, StateBackend, StateConflictError
from dstack_plan.state.lease import (
    LEASE_RECORD,
    LeaderLease,
    LeaseRecord,
    new_holder_id,
    pid_space,
)
from dstack_plan.state.local import LocalBackend
from tests.unit.watch_records_backend import DictRecordsBackend

TTL = 15.0


@pytest.fixture(params=["local", "cas-only"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StateBackend:
    """The local backend, and one with nothing but CAS on records (as S3 will be)."""
    if request.param == "local":
        return LocalBackend(tmp_path / ".dstack" / "state.json")
    return DictRecordsBackend()


def pair(backend: StateBackend, clock: FakeClock) -> tuple[LeaderLease, LeaderLease]:
    return (
        LeaderLease(backend, "a", ttl=TTL, clock=clock),
        LeaderLease(backend, "b", ttl=TTL, clock=clock),
    )


def test_first_holder_leads_and_the_second_waits_for_expiry(backend: StateBackend) -> None:
    clock = FakeClock()
    a, b = pair(backend, clock)
    assert a.acquire_or_renew()
    assert a.valid_until == clock.now() + TTL
    clock.advance(TTL - 0.001)
    assert not b.acquire_or_renew()
    assert b.valid_until is None and not b.is_leader()
    assert a.is_leader()
    clock.advance(0.001)  # a's lease ends exactly now: b may take it, a no longer leads
    assert not a.is_leader()
    assert b.acquire_or_renew()
    assert not a.acquire_or_renew()
    assert a.valid_until is None


def test_two_holders_never_lead_at_overlapping_times(backend: StateBackend) -> None:
    clock = FakeClock()
    a, b = pair(backend, clock)
    terms: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    leaders: list[str] = []
    for step in range(600):
        # uneven steps, so renewals land before, at and after expiry
        clock.advance((step * 7 % 11) * 0.9)
        for lease in (a, b) if step % 3 else (b, a):
            # each holder pauses for stretches longer than the ttl (a stalled process),
            # so the lease changes hands many times
            paused = (step // 20) % 2 if lease is a else (step // 30) % 3 == 2
            if paused:
                continue
            start = clock.now()
            if lease.acquire_or_renew():
                assert lease.valid_until == start + TTL
                terms[lease.holder_id].append((start, start + TTL))
                leaders.append(lease.holder_id)
    assert len(terms["a"]) > 50 and len(terms["b"]) > 50
    assert (
        sum(x != y for x, y in zip(leaders[:-1], leaders[1:], strict=True)) >= 10
    )  # many handovers
    for sa, ea in terms["a"]:
        for sb, eb in terms["b"]:
            assert ea <= sb or eb <= sa, ((sa, ea), (sb, eb))


def test_renewal_keeps_the_term_and_moves_the_expiry(backend: StateBackend) -> None:
    clock = FakeClock()
    a, _ = pair(backend, clock)
    start = clock.now()
    assert a.acquire_or_renew()
    clock.advance(5)
    assert a.acquire_or_renew()
    record = a.current()
    assert record == LeaseRecord(
        holder="a",
        host=socket.gethostname(),
        pid=os.getpid(),
        acquired_at=start,
        renewed_at=start + 5,
        expires_at=start + 5 + TTL,
        pid_space=pid_space(),
    )
    clock.advance(TTL + 1)  # lapsed: taking it again starts a new term
    assert a.current() is None
    assert a.acquire_or_renew()
    renewed = a.current()
    assert renewed is not None and renewed.acquired_at == clock.now()


def test_release_hands_over_at_once_and_only_by_the_holder(backend: StateBackend) -> None:
    clock = FakeClock()
    a, b = pair(backend, clock)
    assert a.acquire_or_renew()
    b.release()  # not b's: nothing happens
    current = a.current()
    assert current is not None and current.holder == "a"
    a.release()
    assert not a.is_leader()
    assert a.current() is None
    assert backend.read_record(LEASE_RECORD).version == ABSENT
    assert b.acquire_or_renew()


def test_a_write_between_read_and_write_loses_the_race(tmp_path: Path) -> None:
    backend = RacingBackend(tmp_path / ".dstack" / "state.json")
    clock = FakeClock()
    a, b = pair(backend, clock)
    backend.before_write = lambda: None if b.acquire_or_renew() else pytest.fail("b lost")
    assert not a.acquire_or_renew()  # b wrote after a read an empty record
    current = a.current()
    assert current is not None and current.holder == "b"


def test_an_unreadable_record_may_be_taken(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    path = backend.record_path(LEASE_RECORD)
    path.parent.mkdir()
    path.write_text("{not json")
    lease = LeaderLease(backend, "a", ttl=TTL, clock=FakeClock())
    assert lease.current() is None
    assert lease.acquire_or_renew()


def test_the_local_record_is_a_private_file_beside_the_state(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    assert LeaderLease(backend, "a", clock=FakeClock()).acquire_or_renew()
    path = tmp_path / ".dstack" / "watch-lease.json"
    assert LeaseRecord.model_validate_json(path.read_bytes()).holder == "a"
    assert path.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / ".dstack" / "state.json").exists()  # the state is not touched


def test_records_are_compare_and_swap(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    version = backend.write_record("x.json", b"1", ABSENT)
    with pytest.raises(StateConflictError):
        backend.write_record("x.json", b"2", ABSENT)
    assert backend.write_record("x.json", b"2", version) != version
    with pytest.raises(StateConflictError):
        backend.write_record("x.json", None, version)  # stale: deletes nothing
    assert backend.read_record("x.json").data == b"2"


def test_record_names_stay_beside_the_state(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "prod.json")
    assert backend.record_path(LEASE_RECORD) == tmp_path / "prod.watch-lease.json"
    for name in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(StateError, match="invalid record name"):
            backend.read_record(name)


def test_holder_ids_differ() -> None:
    assert new_holder_id() != new_holder_id()
    assert new_holder_id().startswith(f"{socket.gethostname()}:{os.getpid()}:")


def test_ttl_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LeaderLease(LocalBackend(tmp_path / "s.json"), "a", ttl=0)


class RacingBackend(LocalBackend):
    """A local backend that runs `before_write` (once) just before a record write."""

    before_write: Callable[[], object] | None = None

    def write_record(self, name: str, data: bytes | None, expected: str) -> str:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()
        return super().write_record(name, data, expected)


@pytest.mark.parametrize("same_space", [True, False])
def test_a_dead_holder_is_replaced_at_once_only_from_its_own_pid_space(
    backend: StateBackend, same_space: bool
) -> None:
    # a hostname is not enough: cloned machines and containers share one, not their pids
    clock = FakeClock()
    dead = subprocess.Popen(["true"])
    dead.wait()
    record = LeaseRecord(
        holder="gone",
        host=socket.gethostname(),
        pid=dead.pid,
        acquired_at=clock.now(),
        renewed_at=clock.now(),
        expires_at=clock.now() + TTL,
        pid_space=pid_space() if same_space else "another-boot:4026531836",
    )
    backend.write_record(LEASE_RECORD, record.to_bytes(), ABSENT)
    assert LeaderLease(backend, "b", ttl=TTL, clock=clock).acquire_or_renew() is same_space
