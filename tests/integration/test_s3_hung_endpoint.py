"""A hung S3 endpoint (moto's server SIGSTOPped: it accepts connections, then says nothing)
fails the command within the bound ($DSTACK_PLAN_BACKEND_TIMEOUT), saying what was
committed and what was not, instead of retrying 15 s reads for minutes.

The bound is set small (3 s) and pytest's timeout generous: the tests assert what failed
and how, never how long it took."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import StateError
from dstack_plan.state import ABSENT, State, commit, hold_lock
from dstack_plan.state.s3_wait import BACKEND_TIMEOUT_ENV, BackendUnresponsive
from tests.infra.moto_process import MotoProcess
from tests.infra.moto_server import S3Bucket
from tests.integration.s3_state_helpers import add, s3_backend, state_of

pytestmark = [pytest.mark.aws, pytest.mark.slow, pytest.mark.timeout(180)]
BOUND = "3s"


@pytest.fixture
def bucket(moto_process: MotoProcess, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    monkeypatch.setenv(BACKEND_TIMEOUT_ENV, BOUND)
    return moto_process.bucket(f"hung-{uuid.uuid4().hex[:12]}")


def test_a_read_from_a_hung_endpoint_fails_within_the_bound(
    moto_process: MotoProcess, bucket: S3Bucket
) -> None:
    s3_backend(bucket).write(state_of("task.a"), ABSENT)
    backend = s3_backend(bucket)
    with moto_process.frozen():
        with pytest.raises(BackendUnresponsive) as info:
            backend.read()
        # the endpoint was given up on: the command's next request fails at once
        with pytest.raises(BackendUnresponsive):
            backend.read_lock_info()
    message = str(info.value)
    assert f"the state backend {backend.location} did not answer within 3s" in message
    assert "nothing was committed" in message
    assert BACKEND_TIMEOUT_ENV in message
    assert s3_backend(bucket).read().state.addresses == ["task.a"]  # it answers again


def test_taking_the_lock_on_a_hung_endpoint_fails_within_the_bound(
    moto_process: MotoProcess, bucket: S3Bucket
) -> None:
    backend = s3_backend(bucket)

    async def take() -> None:
        async with hold_lock(backend, "apply", clock=FakeClock(), renew=False):
            raise AssertionError("the lock cannot be taken from a hung endpoint")

    with moto_process.frozen():
        with pytest.raises(BackendUnresponsive) as info:
            asyncio.run(take())
    message = str(info.value)
    assert "did not answer within 3s; nothing was committed" in message
    assert f"{backend.objects.url(backend.lock_key)} may have been taken as" in message
    assert "dstack state unlock" in message


@pytest.mark.parametrize("versioned", [True, False])
def test_a_commit_that_hangs_says_whether_it_is_in_doubt_and_what_is_stored(
    moto_process: MotoProcess, bucket: S3Bucket, versioned: bool
) -> None:
    if versioned:
        bucket.client().put_bucket_versioning(
            Bucket=bucket.name, VersioningConfiguration={"Status": "Enabled"}
        )
    backend = s3_backend(bucket)
    commit(backend, add("task.a"))  # serial 1: stored
    backend.versioning_enabled()  # asked once, then known

    def freeze_then_add(state: State) -> State:
        # between the commit's read and its write: what it sends next gets no answer
        os.kill(moto_process.pid, signal.SIGSTOP)
        return add("task.b")(state)

    try:
        with pytest.raises(StateError) as info:
            commit(backend, freeze_then_add)
        with pytest.raises(BackendUnresponsive) as later:
            commit(backend, add("task.c"))
    finally:
        os.kill(moto_process.pid, signal.SIGCONT)
    message = str(info.value)
    assert "did not answer within 3s" in message
    if versioned:  # the put of serial 2 was sent: it may have landed
        assert "the commit of task.b is in doubt: it may or may not have been stored" in message
        assert "this command's other commits, up to serial 1, are stored" in message
        assert s3_backend(bucket).read().state.serial in (1, 2)
    else:  # the backup copy goes first: serial 2 was never sent
        assert "the commit of task.b was not stored" in message
        assert "commits up to serial 1 are stored, nothing after them" in message
        assert s3_backend(bucket).read().state.serial == 1
    # the endpoint was given up on: the next commit fails at once, having stored nothing
    assert "this commit was not stored; this command's commits up to serial 1 are stored" in str(
        later.value
    )
