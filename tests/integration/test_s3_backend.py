"""The s3 backend against moto's server over real HTTP: CAS, serials, backups, history,
encryption, records, secrets, and 20 concurrent writers losing nothing."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from dstack_plan.errors import StateError
from dstack_plan.state import ABSENT, SecretGuard, StateConflictError, commit
from dstack_plan.state.s3 import S3Backend
from dstack_plan.state.s3_location import S3Location
from tests.infra.moto_server import MotoServer, S3Bucket
from tests.integration.s3_state_helpers import KEY, add, s3_backend, state_of

pytestmark = pytest.mark.aws


def test_missing_state_reads_empty_and_first_write_is_serial_1(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    assert backend.location == f"s3://{s3_bucket.name}/{KEY}"
    snapshot = backend.read()
    assert snapshot.version == ABSENT and not snapshot.exists and not snapshot.state.resources
    written = backend.write(state_of("task.a"), ABSENT)
    assert written.state.serial == 1 and written.version.startswith('"')
    again = s3_backend(s3_bucket).read()
    assert again == written


def test_serial_grows_by_one_and_noop_keeps_etag(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    first = backend.write(state_of("task.a"), ABSENT)
    second = backend.write(add("task.b")(first.state), first.version)
    assert second.state.serial == 2 and second.version != first.version
    same = backend.write(second.state.model_copy(update={"serial": 99}), second.version)
    assert same == second
    assert backend.read().version == second.version


def test_empty_state_over_nothing_writes_nothing(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    assert backend.write(state_of(), ABSENT).version == ABSENT
    assert s3_bucket.client().list_objects_v2(Bucket=s3_bucket.name).get("KeyCount") == 0


def test_stale_etag_conflicts_and_leaves_state(s3_bucket: S3Bucket) -> None:
    one, two = s3_backend(s3_bucket), s3_backend(s3_bucket)
    base = one.write(state_of("task.a"), ABSENT)
    two.write(add("task.b")(base.state), base.version)
    with pytest.raises(StateConflictError) as info:
        one.write(add("task.c")(base.state), base.version)
    assert info.value.expected == base.version and KEY in str(info.value)
    assert one.read().state.addresses == ["task.a", "task.b"]
    with pytest.raises(StateConflictError):  # a second "first write" must not clobber it
        two.write(state_of("task.z"), ABSENT)


def test_conditional_put_is_the_guard(s3_bucket: S3Bucket) -> None:
    """A writer that passed the read check still loses if the object changes before its put."""
    backend = s3_backend(s3_bucket)
    base = backend.write(state_of("task.a"), ABSENT)
    client = backend.objects.client

    def sneak_in(**_: object) -> None:
        client.meta.events.unregister("before-call.s3.PutObject", sneak_in)
        s3_backend(s3_bucket).write(add("task.x")(base.state), base.version)

    client.meta.events.register("before-call.s3.PutObject", sneak_in)
    with pytest.raises(StateConflictError):
        backend.write(add("task.b")(base.state), base.version)
    assert backend.read().state.addresses == ["task.a", "task.x"]


def test_other_lineage_refused(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    base = backend.write(state_of("task.a"), ABSENT)
    with pytest.raises(StateError, match="unrelated state of lineage"):
        backend.write(state_of("task.b"), base.version)


def test_secrets_refused_before_anything_is_written(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket, secret_guard=SecretGuard(["hf_supersecret"]))
    with pytest.raises(StateError, match="contains the value of a secret") as info:
        backend.write(add("task.a", token="hf_supersecret")(state_of()), ABSENT)
    assert "hf_supersecret" not in str(info.value)
    assert backend.read().version == ABSENT


def test_encrypted_with_sse_s3_and_checksum_metadata(s3_bucket: S3Bucket) -> None:
    s3_backend(s3_bucket).write(state_of("task.a"), ABSENT)
    head = s3_bucket.client().head_object(Bucket=s3_bucket.name, Key=KEY)
    assert head["ServerSideEncryption"] == "AES256"
    assert len(head["Metadata"]["sha256"]) == 64
    assert head["ContentType"] == "application/json"


def test_encrypted_with_kms_key_when_set(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket, kms_key_id="alias/dstack-state")
    base = backend.write(state_of("task.a"), ABSENT)
    backend.write(add("task.b")(base.state), base.version)  # the backup copy too
    client = s3_bucket.client()
    for key in (KEY, KEY + ".backup"):
        head = client.head_object(Bucket=s3_bucket.name, Key=key)
        assert head["ServerSideEncryption"] == "aws:kms"
        assert head["SSEKMSKeyId"] == "alias/dstack-state"


def test_unversioned_backup_and_history(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    assert not backend.versioning_enabled()
    snap = backend.write(state_of("task.a"), ABSENT)
    assert backend.history()[0].serial == 1 and len(backend.history()) == 1
    for name in ("task.b", "task.c"):
        snap = backend.write(add(name)(snap.state), snap.version)
    history = backend.history()
    assert [(v.serial, v.current) for v in history] == [(3, True), (2, False)]
    assert {v.lineage for v in history} == {snap.state.lineage}
    assert history[0].written_at is not None
    assert backend.read_version(history[1].id).addresses == ["task.a", "task.b"]
    with pytest.raises(StateError, match="no such version"):
        backend.read_version("nonsense")


def test_versioned_history_lists_every_serial(moto_server: MotoServer) -> None:
    bucket = moto_server.bucket(versioning=True)
    backend = s3_backend(bucket)
    assert backend.versioning_enabled()
    snap = backend.write(state_of("task.r0"), ABSENT)
    for i in range(1, 4):
        snap = backend.write(add(f"task.r{i}")(snap.state), snap.version)
    keys = [o["Key"] for o in bucket.client().list_objects_v2(Bucket=bucket.name)["Contents"]]
    assert keys == [KEY]  # S3 keeps the old versions: no .backup object
    history = backend.history()
    assert [v.serial for v in history] == [4, 3, 2, 1]
    assert [v.current for v in history] == [True, False, False, False]
    assert backend.read_version(history[2].id).serial == 2
    assert len(backend.read_version(history[3].id).resources) == 1


def test_records_cas_and_delete(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    assert backend.read_record("watch-lease.json").version == ABSENT
    v1 = backend.write_record("watch-lease.json", b'{"holder": "a"}', ABSENT)
    with pytest.raises(StateConflictError):
        backend.write_record("watch-lease.json", b'{"holder": "b"}', ABSENT)
    v2 = backend.write_record("watch-lease.json", b'{"holder": "a", "n": 2}', v1)
    with pytest.raises(StateConflictError):
        backend.write_record("watch-lease.json", b"{}", v1)
    with pytest.raises(StateConflictError):
        backend.write_record("watch-lease.json", None, v1)
    with pytest.raises(StateConflictError):  # deleting "nothing" while it exists
        backend.write_record("watch-lease.json", None, ABSENT)
    assert backend.read_record("watch-lease.json") == (b'{"holder": "a", "n": 2}', v2)
    assert backend.write_record("watch-lease.json", None, v2) == ABSENT
    assert backend.read_record("watch-lease.json").data is None
    keys = s3_bucket.client().list_objects_v2(Bucket=s3_bucket.name).get("Contents", [])
    assert keys == []


def test_record_names_stay_beside_the_state(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    assert backend.record_key("events.jsonl") == f"{KEY}.events.jsonl"
    for bad in ("../x", "a/b", "lock", "backup", ""):
        with pytest.raises(StateError, match="invalid record name"):
            backend.read_record(bad)


def test_append_lines_default_keeps_a_bounded_log(s3_bucket: S3Bucket) -> None:
    backend = s3_backend(s3_bucket)
    for i in range(12):
        backend.append_lines("events.jsonl", [b"%d" % i], keep_last=4, trim_past=8)
    data = backend.read_record("events.jsonl").data or b""
    assert data.splitlines()[-1] == b"11" and len(data.splitlines()) <= 8


@pytest.mark.parametrize("versioning", [False, True])
def test_twenty_concurrent_writers_lose_nothing(moto_server: MotoServer, versioning: bool) -> None:
    writers = 20
    bucket = moto_server.bucket(versioning=versioning)
    serials: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def work(index: int) -> None:
        backend = s3_backend(bucket, client=bucket.client())
        start.wait()
        try:
            snap = commit(backend, add(f"task.w{index}", index=index))
            serials.append(snap.state.serial)
        except BaseException as err:  # reported below, with the others
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    backend = s3_backend(bucket)
    final = backend.read().state
    assert final.addresses == sorted(f"task.w{i}" for i in range(writers))
    # one write per commit: 20 content changes, each exactly one serial up
    assert final.serial == writers
    assert set(serials) <= set(range(1, writers + 1))
    if versioning:  # every stored version, newest first: no gap, no repeat
        assert [v.serial for v in backend.history()] == list(range(writers, 0, -1))
    else:
        # Returned serials are normally 1..20 once each. moto's server sometimes answers a
        # PutObject that landed with a 500 (a race in its in-memory store); botocore's retry
        # then gets 412 and the commit finds its change already in, returning the serial it
        # reads then, which may be a later writer's. Real S3 can do the same on a timeout.
        assert len(set(serials)) >= writers - 3


def test_missing_boto3_says_what_to_install(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    backend = S3Backend(S3Location.from_url(s3_bucket.url()))
    with pytest.raises(StateError, match=r"pip install 'dstack-plan\[aws\]'"):
        backend.read()


def test_importing_the_backend_does_not_import_boto3() -> None:
    code = "import sys, dstack_plan.state.s3; assert 'boto3' not in sys.modules, 'boto3'"
    subprocess.run([sys.executable, "-c", code], check=True)
