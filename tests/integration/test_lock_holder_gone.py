"""The operation lock when its holder is gone, or elsewhere: a lock left by a process of
this machine that no longer runs (kill -9) is taken over at once, without waiting out its
lease; a holder on another machine (or alive) is named, with its age and the command that
removes its lock. S3 through moto's server; the local backend across real processes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import LockError
from dstack_plan.state import LocalBackend, LockInfo, hold_lock
from dstack_plan.state.liveness import pid_space, process_start
from dstack_plan.state.s3 import S3Backend
from tests.conftest import REPO_ROOT
from tests.infra.moto_server import S3Bucket
from tests.integration.s3_state_helpers import KEY, s3_backend

pytestmark = pytest.mark.timeout(120)
HOUR = 3600.0

# Takes the lock through the Python API as `apply` does, says its id, then waits to be killed.
_HOLDER = """
import sys, time
from dstack_plan.clock import SystemClock
from dstack_plan.state.select import parse_where, backend_at
backend = backend_at(parse_where(sys.argv[1]))
handle = backend.try_lock("apply", sys.argv[2], 3600.0, SystemClock())
print(handle.info.id, flush=True)
time.sleep(3600)
"""


def _start_holder(where: str, who: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, where, who], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    lock_id = proc.stdout.readline().strip()
    assert lock_id, "the holder did not take the lock"
    return proc, lock_id


def _kill_9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


async def _take(backend: S3Backend | LocalBackend, clock: FakeClock) -> LockInfo:
    async with hold_lock(backend, "apply", who="bob@laptop", clock=clock, renew=False) as held:
        return held.info


def _warnings(caplog: pytest.LogCaptureFixture) -> str:
    return " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.aws
def test_a_killed_holder_on_this_machine_is_taken_over_at_once(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    backend = s3_backend(s3_bucket)
    proc, lock_id = _start_holder(s3_bucket.url(), "killed@ci")
    try:
        held = backend.read_lock_info()
        assert held is not None and held.id == lock_id and held.pid == proc.pid
        # a clock that never moves: no lease can run out by it
        clock = FakeClock(time.time())
        with pytest.raises(LockError) as alive:  # while it runs, it holds the lock
            asyncio.run(_take(backend, clock))
        assert "killed@ci" in str(alive.value) and f"dstack state unlock {lock_id}" in str(
            alive.value
        )
    finally:
        _kill_9(proc)
    with caplog.at_level(logging.WARNING):
        mine = asyncio.run(_take(backend, clock))
    assert not held.is_expired(clock.now())  # taken over long before its lease ran out
    assert mine.id != lock_id and mine.who == "bob@laptop"
    assert (
        f"took over the lock of apply by killed@ci (pid {proc.pid}, which no longer runs"
        in _warnings(caplog)
    )
    assert backend.read_lock_info() is None  # released at the end of the block


def _put_record(bucket: S3Bucket, record: LockInfo) -> None:
    bucket.client().put_object(
        Bucket=bucket.name, Key=KEY + ".lock", Body=record.to_json().encode()
    )


def _record(clock: FakeClock, *, age: float, lease: float, **fields: object) -> LockInfo:
    created = datetime.fromtimestamp(clock.now() - age, tz=timezone.utc)
    return LockInfo(
        id=str(uuid.uuid4()),
        operation="apply",
        who="alice@ci-runner-7",
        created=created,
        expires=created + timedelta(seconds=lease),
        path=f"s3://bucket/{KEY}",
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.aws
def test_a_holder_on_another_machine_is_named_with_its_age_and_the_unlock_command(
    s3_bucket: S3Bucket,
) -> None:
    clock = FakeClock(time.time())
    record = _record(
        clock,
        age=192,
        lease=300,
        host="ci-runner-7",
        pid=4242,
        pid_space="another-boot:4026531836",
        pid_start=12345,
    )
    _put_record(s3_bucket, record)
    with pytest.raises(LockError) as info:
        asyncio.run(_take(s3_backend(s3_bucket), clock))
    message = str(info.value)
    assert info.value.holder == record
    assert "apply by alice@ci-runner-7 (pid 4242 on ci-runner-7)" in message
    assert "started 3m12s ago" in message
    assert f"dstack state unlock {record.id}" in message
    assert "its lease runs out in 1m48s" in message
    assert "Wait for that operation to finish" not in message
    assert s3_backend(s3_bucket).read_lock_info() == record  # left alone


@pytest.mark.aws
@pytest.mark.parametrize("started", ["same", "other"])
def test_a_pid_now_running_another_program_is_not_the_holder(
    s3_bucket: S3Bucket, started: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(time.time())
    other = subprocess.Popen(["sleep", "60"])
    try:
        start = process_start(other.pid)
        assert start is not None
        record = _record(
            clock,
            age=5,
            lease=HOUR,
            host="this-machine",
            pid=other.pid,
            pid_space=pid_space(),
            pid_start=start if started == "same" else start - 1,
        )
        _put_record(s3_bucket, record)
        backend = s3_backend(s3_bucket)
        if started == "same":  # that very process, alive: it holds the lock
            with pytest.raises(LockError, match=f"dstack state unlock {record.id}"):
                asyncio.run(_take(backend, clock))
            return
        with caplog.at_level(logging.WARNING):
            asyncio.run(_take(backend, clock))  # the pid was reused: the holder is gone
        assert f"(pid {other.pid}, which no longer runs" in _warnings(caplog)
    finally:
        other.kill()
        other.wait()


def test_local_lock_held_names_the_holder_its_age_and_the_unlock_command(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    proc, lock_id = _start_holder(str(path), "alice@laptop")
    try:
        held = LocalBackend(path).read_lock_info()
        assert held is not None and held.id == lock_id
        clock = FakeClock(held.created.timestamp() + 75)  # 75 s after it took the lock
        with pytest.raises(LockError) as info:
            asyncio.run(_take(LocalBackend(path), clock))
        message = str(info.value)
        assert f"apply by alice@laptop (pid {proc.pid} on " in message
        assert "started 1m15s ago" in message
        assert "stop its process" in message
        assert f"dstack state unlock {lock_id}" in message
    finally:
        _kill_9(proc)
    # the flock went with the process: the next apply takes the lock at once
    assert asyncio.run(_take(LocalBackend(path), FakeClock(time.time()))).who == "bob@laptop"
