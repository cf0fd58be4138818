"""The S3 state lock and a state backend that stops answering, through the CLI.

- an apply killed with -9 on this machine leaves its lock behind: the next `dstack apply`
  here takes it over at once (its lease, an hour here, is nowhere near over) and says so;
- a lock held from another machine is refused naming the holder, its age and
  `dstack state unlock ID`, which then frees it;
- a hung endpoint (moto's server SIGSTOPped) fails `plan` and `apply` within the bound
  ($DSTACK_PLAN_BACKEND_TIMEOUT, 1 s here) saying nothing was committed. No wall-clock
  assertions: the commands' own timeouts are generous, the assertions are on what they say.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dstack_plan.state import LockInfo
from dstack_plan.state.s3 import S3Backend
from dstack_plan.state.s3_location import S3Location
from tests.conftest import REPO_ROOT
from tests.e2e.conftest import Dstack
from tests.infra.moto_process import MotoProcess
from tests.infra.moto_server import S3Bucket

pytestmark = [pytest.mark.aws, pytest.mark.timeout(300)]
BACKEND_TIMEOUT_ENV = "DSTACK_PLAN_BACKEND_TIMEOUT"  # the documented names
LOCK_LEASE_ENV = "DSTACK_PLAN_LOCK_LEASE"
TASK = """\
type: task
name: job
commands: ["echo hi"]
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""
_HOLDER = """
import sys, time
from dstack_plan.clock import SystemClock
from dstack_plan.state.select import backend_at, parse_where
handle = backend_at(parse_where(sys.argv[1])).try_lock(
    "apply", sys.argv[2], 3600.0, SystemClock()
)
print(handle.info.id, flush=True)
time.sleep(3600)
"""


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "job.dstack.yml").write_text(TASK)
    return project


def _s3(bucket: S3Bucket, cli_env: dict[str, str]) -> S3Backend:
    cli_env.update(bucket.env, DSTACK_STATE=bucket.url(), **{LOCK_LEASE_ENV: "1h"})
    return S3Backend(S3Location.from_url(bucket.url()))


def test_apply_takes_over_the_lock_of_an_apply_killed_on_this_machine(
    dstack: Dstack, s3_bucket: S3Bucket, cli_env: dict[str, str], tmp_path: Path
) -> None:
    _project(tmp_path)
    backend = _s3(s3_bucket, cli_env)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, s3_bucket.url(), "killed@ci"],
        stdout=subprocess.PIPE,
        text=True,
        env={**cli_env, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert holder.stdout is not None
    lock_id = holder.stdout.readline().strip()
    held = backend.read_lock_info()
    assert held is not None and held.id == lock_id and held.pid == holder.pid
    holder.kill()  # SIGKILL: it cannot release anything
    holder.wait(timeout=30)

    done = dstack("apply", "-y")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"took over the lock of apply by killed@ci (pid {holder.pid}, which no longer runs"
        in done.stderr
    ), done.stderr
    # taken over because its holder is gone, not because its lease (1 h) ran out
    assert "took over the expired state lock" not in done.stderr
    assert backend.read().state.addresses == ["task.job"]
    assert backend.read_lock_info() is None


def test_a_lock_held_from_another_machine_names_its_holder_and_the_unlock_command(
    dstack: Dstack, s3_bucket: S3Bucket, cli_env: dict[str, str], tmp_path: Path
) -> None:
    _project(tmp_path)
    backend = _s3(s3_bucket, cli_env)
    created = datetime.now(timezone.utc) - timedelta(minutes=7)
    record = LockInfo(
        id=str(uuid.uuid4()),
        operation="apply",
        who="alice@ci-runner-7",
        created=created,
        expires=created + timedelta(hours=1),
        path=backend.location,
        pid=4242,
        host="ci-runner-7",
        pid_space="another-boot:4026531836",
        pid_start=12345,
    )
    s3_bucket.client().put_object(
        Bucket=s3_bucket.name, Key=backend.lock_key, Body=record.to_json().encode()
    )
    refused = dstack("apply", "-y")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    err = refused.stderr
    assert "apply by alice@ci-runner-7 (pid 4242 on ci-runner-7), started 7m" in err, err
    assert f"dstack state unlock {record.id}" in err
    assert not backend.read().exists  # nothing applied

    unlocked = dstack("state", "unlock", record.id)
    assert unlocked.returncode == 0, unlocked.stderr
    done = dstack("apply", "-y")
    assert done.returncode == 0, done.stdout + done.stderr
    assert backend.read().state.addresses == ["task.job"]


@pytest.mark.slow
@pytest.mark.parametrize("command", [("plan",), ("apply", "-y")])
def test_a_hung_endpoint_fails_the_command_within_the_bound(
    dstack: Dstack,
    moto_process: MotoProcess,
    cli_env: dict[str, str],
    tmp_path: Path,
    command: tuple[str, ...],
) -> None:
    _project(tmp_path)
    bucket = moto_process.bucket(f"hung-{uuid.uuid4().hex[:12]}")
    cli_env.update(bucket.env, DSTACK_STATE=bucket.url(), **{BACKEND_TIMEOUT_ENV: "1"})
    with moto_process.frozen():
        done = dstack(*command, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    state = f"s3://{bucket.name}/team/state.json"
    assert f"the state backend {state} did not answer within 1s" in done.stderr, done.stderr
    assert "nothing was committed" in done.stderr
    assert "this is a bug" not in done.stderr
