"""Faults on the s3 backend: corrupt and truncated objects, 500s and timeouts on PutObject,
a dead endpoint, a missing bucket. Each is a clear StateError naming the URL, and the state
that was there before stays readable."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError

from dstack_plan.errors import StateError
from dstack_plan.state import ABSENT, StateSnapshot
from dstack_plan.state.s3 import S3Backend
from dstack_plan.state.s3_location import S3Location
from dstack_plan.state.s3_objects import CONNECT_TIMEOUT
from dstack_plan.state.s3_wait import BACKEND_TIMEOUT_ENV, BackendUnresponsive
from tests.infra.moto_server import S3Bucket
from tests.integration.s3_state_helpers import KEY, add, s3_backend, state_of

pytestmark = pytest.mark.aws
_ERROR = (
    b'<?xml version="1.0"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error.</Message><RequestId>r</RequestId></Error>"
)


class _Raw:
    def stream(self, **_: object) -> Any:
        return iter([_ERROR])

    def read(self, *_: object, **__: object) -> bytes:
        return _ERROR


def _put_raw(bucket: S3Bucket, body: bytes, sha256: str | None) -> None:
    metadata = {"sha256": sha256} if sha256 is not None else {}
    bucket.client().put_object(Bucket=bucket.name, Key=KEY, Body=body, Metadata=metadata)


def _written(bucket: S3Bucket) -> tuple[S3Backend, StateSnapshot]:
    backend = s3_backend(bucket)
    return backend, backend.write(state_of("task.a", "task.b"), ABSENT)


def test_truncated_object_is_an_error_not_an_empty_state(s3_bucket: S3Bucket) -> None:
    _, snap = _written(s3_bucket)
    body = snap.state.to_json().encode()
    _put_raw(s3_bucket, body[: len(body) // 2], hashlib.sha256(body).hexdigest())
    with pytest.raises(StateError, match="corrupt or truncated") as info:
        s3_backend(s3_bucket).read()
    assert f"s3://{s3_bucket.name}/{KEY}" in str(info.value)


def test_metadata_disagreeing_with_body_is_an_error(s3_bucket: S3Bucket) -> None:
    _, snap = _written(s3_bucket)
    other = add("task.c")(snap.state).to_json().encode()  # valid JSON, wrong checksum
    _put_raw(s3_bucket, other, "0" * 64)
    with pytest.raises(StateError, match="sha256 does not match"):
        s3_backend(s3_bucket).read()


def test_unparseable_body_is_an_error_naming_the_url(s3_bucket: S3Bucket) -> None:
    body = b'{"format_version": 1, "lineage": '
    _put_raw(s3_bucket, body, hashlib.sha256(body).hexdigest())
    with pytest.raises(StateError, match="not valid JSON") as info:
        s3_backend(s3_bucket).read()
    assert f"s3://{s3_bucket.name}/{KEY}" in str(info.value)


def test_object_without_checksum_is_still_read(s3_bucket: S3Bucket) -> None:
    """Uploaded by hand (`aws s3 cp`): nothing to verify, but it must still parse."""
    _, snap = _written(s3_bucket)
    _put_raw(s3_bucket, snap.state.to_json().encode(), None)
    assert s3_backend(s3_bucket).read().state == snap.state


def _inject(backend: S3Backend, respond: Callable[[Any], Any]) -> list[int]:
    sends: list[int] = []

    def hook(request: Any, **_: object) -> Any:
        sends.append(1)
        return respond(request)

    backend.objects.client.meta.events.register("before-send.s3.PutObject", hook)
    return sends


def _server_error(request: Any) -> AWSResponse:
    return AWSResponse(request.url, 500, {"Content-Type": "application/xml"}, _Raw())


def _timeout(request: Any) -> None:
    raise ReadTimeoutError(endpoint_url=request.url)


@pytest.mark.parametrize(
    ("respond", "reason"), [(_server_error, "InternalError"), (_timeout, "timeout")]
)
def test_put_failure_keeps_the_old_state(
    s3_bucket: S3Bucket, respond: Callable[[Any], Any], reason: str
) -> None:
    backend, snap = _written(s3_bucket)
    sends = _inject(backend, respond)
    with pytest.raises(StateError) as info:
        backend.write(add("task.c")(snap.state), snap.version)
    message = str(info.value)
    assert f"s3://{s3_bucket.name}/{KEY}" in message and reason.lower() in message.lower()
    assert len(sends) >= 2  # botocore retried before giving up
    after = s3_backend(s3_bucket).read()
    assert after == snap


def test_a_transient_500_is_retried_and_the_write_lands(s3_bucket: S3Bucket) -> None:
    backend, snap = _written(s3_bucket)
    failures = iter([True])
    _inject(backend, lambda request: _server_error(request) if next(failures, False) else None)
    written = backend.write(add("task.c")(snap.state), snap.version)
    assert written.state.serial == 2 and s3_backend(s3_bucket).read() == written


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dead_endpoint_fails_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused connection fails the read on its own error after botocore's few attempts,
    not by waiting out a timeout (how long that takes: benchmarks/prompt_failures.py)."""
    # credentials of its own: not left to whichever test started moto before this one
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dead-endpoint-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dead-endpoint-secret-value")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # the bound on an endpoint that does not answer, made long: passing never depends on
    # being quick, and a read that waited for an answer would fail saying "did not answer"
    monkeypatch.setenv(BACKEND_TIMEOUT_ENV, "3600")
    where = S3Location.from_url(
        f"s3://some-bucket/{KEY}?region=us-east-1&endpoint_url=http://127.0.0.1:{_closed_port()}"
    )
    backend = S3Backend(where)
    config = backend.objects.client.meta.config
    assert config.connect_timeout == CONNECT_TIMEOUT
    attempts = config.retries["total_max_attempts"]  # botocore's, from MAX_ATTEMPTS
    sends: list[int] = []
    backend.objects.client.meta.events.register(
        "before-send.s3.GetObject", lambda **_: sends.append(1)
    )
    with pytest.raises(StateError) as info:
        backend.read()
    message = str(info.value)
    assert message.startswith(f"s3://some-bucket/{KEY}: cannot read: Could not connect to the")
    assert not isinstance(info.value, BackendUnresponsive)
    assert len(sends) == attempts  # each refused, and then no more
    assert "dead-endpoint-secret-value" not in message


def test_missing_bucket_is_named(s3_bucket: S3Bucket) -> None:
    where = S3Location.from_url(s3_bucket.url())._replace(bucket=s3_bucket.name + "-gone")
    with pytest.raises(StateError, match="does not exist"):
        S3Backend(where).read()
