"""The s3 backend's operation lock on moto: contention, takeover after expiry, renewal,
release and force-unlock, all conditional on the lock object's ETag."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import LockError
from dstack_plan.state import LockInfo, hold_lock
from tests.infra.moto_server import S3Bucket
from tests.integration.s3_state_helpers import KEY, s3_backend

pytestmark = pytest.mark.aws
TTL = 60.0


def test_lock_object_holds_the_record(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    clock = FakeClock()
    assert backend.read_lock_info() is None
    handle = backend.try_lock("apply", "alice@ci", TTL, clock)
    raw = s3_bucket.client().get_object(Bucket=s3_bucket.name, Key=KEY + ".lock")
    record = json.loads(raw["Body"].read())
    assert {"id", "operation", "who", "created", "expires", "path", "pid"} <= set(record)
    assert record["who"] == "alice@ci" and record["path"] == backend.location
    assert raw["ServerSideEncryption"] == "AES256"
    assert backend.read_lock_info() == handle.info
    handle.release()
    assert backend.read_lock_info() is None
    handle.release()  # a second release does nothing


def test_second_locker_is_told_who_holds_it(s3_bucket: S3Bucket) -> None:
    clock = FakeClock()
    held = s3_backend(s3_bucket).try_lock("apply", "alice@ci", TTL, clock)
    with pytest.raises(LockError) as info:
        s3_backend(s3_bucket).try_lock("destroy", "bob@laptop", TTL, clock)
    assert isinstance(info.value.holder, LockInfo) and info.value.holder.id == held.info.id
    message = str(info.value)
    assert "alice@ci" in message and held.info.id in message and "apply" in message
    held.release()
    s3_backend(s3_bucket).try_lock("destroy", "bob@laptop", TTL, clock).release()


def test_expired_lock_is_taken_over_with_a_warning(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    dead = s3_backend(s3_bucket).try_lock("apply", "killed@ci", TTL, clock)
    clock.advance(TTL - 1)
    with pytest.raises(LockError):  # not expired yet
        s3_backend(s3_bucket).try_lock("apply", "bob@laptop", TTL, clock)
    clock.advance(2)
    with caplog.at_level(logging.WARNING):
        new = s3_backend(s3_bucket).try_lock("apply", "bob@laptop", TTL, clock)
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "took over the expired state lock" in warning
    assert dead.info.id in warning and "killed@ci" in warning and "apply" in warning
    assert s3_backend(s3_bucket).read_lock_info() == new.info
    # the old holder comes back: it can neither renew nor release the new owner's lock
    with pytest.raises(LockError, match="lost the state lock") as info:
        dead.renew()
    assert "bob@laptop" in str(info.value)
    dead.release()
    assert s3_backend(s3_bucket).read_lock_info() == new.info
    new.renew()
    new.release()
    assert s3_backend(s3_bucket).read_lock_info() is None


def test_renewal_pushes_expiry_so_no_takeover(s3_bucket: S3Bucket) -> None:
    clock = FakeClock()
    held = s3_backend(s3_bucket).try_lock("apply", "alice@ci", TTL, clock)
    for _ in range(3):
        clock.advance(TTL / 2)
        held.renew()
    assert s3_backend(s3_bucket).read_lock_info() == held.info
    with pytest.raises(LockError):
        s3_backend(s3_bucket).try_lock("apply", "bob@laptop", TTL, clock)
    held.release()


def test_unlock_only_with_the_right_id(s3_bucket: S3Bucket) -> None:
    clock = FakeClock()
    backend = s3_backend(s3_bucket)
    with pytest.raises(LockError, match="is not locked"):
        backend.unlock("whatever")
    held = s3_backend(s3_bucket).try_lock("apply", "alice@ci", TTL, clock)
    with pytest.raises(LockError, match="does not match") as info:
        backend.unlock("not-the-id")
    assert held.info.id in str(info.value) and "alice@ci" in str(info.value)
    assert backend.read_lock_info() == held.info
    backend.unlock(held.info.id)
    assert backend.read_lock_info() is None
    with pytest.raises(LockError, match="lost the state lock"):
        held.renew()


def test_concurrent_lockers_exactly_one_wins(s3_bucket: S3Bucket) -> None:
    clock = FakeClock()

    async def attempt(i: int) -> str:
        backend = s3_backend(s3_bucket, client=s3_bucket.client())
        try:
            await asyncio.to_thread(backend.try_lock, "apply", f"user{i}", TTL, clock)
        except LockError:
            return "held"
        return "won"

    async def main() -> list[str]:
        return await asyncio.gather(*(attempt(i) for i in range(8)))

    assert sorted(asyncio.run(main())) == ["held"] * 7 + ["won"]


def test_hold_lock_with_lock_timeout_waits_for_release(s3_bucket: S3Bucket) -> None:
    clock = FakeClock()
    held = s3_backend(s3_bucket).try_lock("apply", "alice@ci", TTL, clock)

    async def main() -> str:
        backend = s3_backend(s3_bucket)
        waiter = asyncio.create_task(_take(backend, clock))
        await asyncio.sleep(0)
        held.release()
        return await waiter

    assert asyncio.run(main()) == "bob@laptop"


async def _take(backend: object, clock: FakeClock) -> str:
    async with hold_lock(
        backend,  # type: ignore[arg-type]
        "apply",
        who="bob@laptop",
        timeout=30,
        clock=clock,
        ttl=TTL,
        renew=False,
    ) as handle:
        return handle.info.who


def test_unreadable_lock_record_is_taken_over_once_stale(s3_bucket: S3Bucket) -> None:
    s3_bucket.client().put_object(Bucket=s3_bucket.name, Key=KEY + ".lock", Body=b"{garbage")
    backend = s3_backend(s3_bucket)
    with pytest.raises(LockError, match="not readable"):  # fresh: maybe someone's, wait
        backend.try_lock("apply", "bob@laptop", TTL, FakeClock(time.time()))
    later = FakeClock(time.time() + TTL + 5)
    handle = backend.try_lock("apply", "bob@laptop", TTL, later)
    assert backend.read_lock_info() == handle.info
    handle.release()
