"""The S3 calls the s3 backend makes: conditional get/put/delete, with errors translated.

One `S3Objects` per backend wraps one boto3 client. boto3 is imported here, on first use
only, so `dstack` commands that never touch S3 do not pay for it (or need it). Every failure
becomes a StateError naming the `s3://` URL; a failed precondition is returned to the caller
(it decides between a conflict and a lost lock). Credentials never appear: they come from
boto3's chain and botocore's messages do not carry them.

Every request runs under the backend's `WaitBudget` (`state/s3_wait.py`): an endpoint that
does not answer fails the command with `BackendUnresponsive` after the bound (20 s by
default), however many requests and retries were waiting on it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from dstack_plan.errors import StateError
from dstack_plan.state.s3_location import S3Location
from dstack_plan.state.s3_wait import (
    BackendUnresponsive,
    WaitBudget,
    backend_timeout,
    call_within,
)

T = TypeVar("T")

AWS_EXTRA_HINT = "pip install 'dstack-plan[aws]'"
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 15.0
MAX_ATTEMPTS = 3
"""botocore's standard retry mode: 3 attempts in all, so a refused connection fails in
seconds; a hung endpoint is bounded by the backend's WaitBudget."""
SHA256_META = "sha256"
"""Object metadata (`x-amz-meta-sha256`) holding the hex sha256 of the body."""
# A failed If-Match / If-None-Match: 412, 409 when racing another conditional write, and
# 404 when an If-Match names an object someone deleted.
PRECONDITION_CODES = frozenset(
    {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"}
)


ANY_VERSION = "*"
"""`expected` for an unconditional put."""


class S3Object(NamedTuple):
    """An object as read: its bytes, ETag, metadata and (in a versioned bucket) version id."""

    body: bytes
    etag: str
    metadata: dict[str, str]
    version_id: str | None
    last_modified: datetime | None


class Unchanged(Enum):
    """What a conditional get returns when the object still has the ETag it was given."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


class PreconditionFailed(Exception):
    """A conditional write found the object changed (not a user-facing error)."""


def sha256_hex(data: bytes) -> str:
    """The hex sha256 of `data`, as stored in the object's metadata."""
    return hashlib.sha256(data).hexdigest()


def make_client(where: S3Location) -> Any:
    """A boto3 S3 client for `where`: its profile/region session, endpoint, short timeouts."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise StateError(
            f"{where.object_url}: the s3 state backend needs boto3: {AWS_EXTRA_HINT}"
        ) from None
    config = Config(
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
    )
    try:
        session = boto3.session.Session(profile_name=where.profile, region_name=where.region)
        return session.client("s3", endpoint_url=where.endpoint_url, config=config)
    except BotoCoreError as err:  # an unknown profile, a malformed endpoint
        raise StateError(f"{where.object_url}: cannot set up the S3 client: {err}") from None


def _no_answer(err: BaseException) -> bool:
    """True for a request that got no answer: connecting failed or timed out, the
    connection closed or a read timed out (an error status is an answer)."""
    from botocore.exceptions import ConnectionError, HTTPClientError

    return isinstance(err, (ConnectionError, HTTPClientError))


def _error_code(err: Any) -> tuple[str, str]:
    error = err.response.get("Error", {})
    status = str(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return str(error.get("Code") or status), str(error.get("Message") or "")


class S3Objects:
    """Get, put and delete objects of one bucket, translating every error (see module)."""

    def __init__(
        self, where: S3Location, client: Any | None = None, *, budget: WaitBudget | None = None
    ) -> None:
        self.where = where
        self.budget = budget if budget is not None else WaitBudget(backend_timeout())
        """How long this backend's requests may still wait without an answer."""
        self._client = client
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 client, created on first use (boto3 clients are thread-safe)."""
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.where)
            return self._client

    def url(self, key: str) -> str:
        return f"s3://{self.where.bucket}/{key}"

    def unresponsive(self) -> BackendUnresponsive:
        """The error for an endpoint that did not answer within the budget's bound."""
        return BackendUnresponsive(self.where.object_url, self.budget.bound)

    def _within(self, request: Callable[[], T]) -> T:
        """Run one request (with botocore's retries) under the wait budget."""
        return call_within(self.budget, request, _no_answer, self.unresponsive)

    def _fail(self, key: str, what: str, err: Exception) -> StateError:
        from botocore.exceptions import ClientError

        if isinstance(err, ClientError):
            code, message = _error_code(err)
            detail = f"{code}: {message}" if message else code
            if code in ("NoSuchBucket",):
                detail = f"bucket {self.where.bucket} does not exist"
        else:  # BotoCoreError: no credentials, connection refused, timeouts
            detail = str(err) or type(err).__name__
        return StateError(f"{self.url(key)}: cannot {what}: {detail}")

    def _call(self, key: str, what: str, method: str, **kwargs: Any) -> Any:
        """Call `client.<method>`; PreconditionFailed on a failed condition, else StateError."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client
        try:
            return self._within(
                lambda: getattr(client, method)(Bucket=self.where.bucket, Key=key, **kwargs)
            )
        except ClientError as err:
            code, _ = _error_code(err)
            conditional = any(k.startswith(("If", "CopySourceIf")) for k in kwargs)
            if conditional and code in PRECONDITION_CODES:
                raise PreconditionFailed(code) from None
            raise self._fail(key, what, err) from None
        except BotoCoreError as err:
            raise self._fail(key, what, err) from None

    def get(self, key: str, version_id: str | None = None) -> S3Object | None:
        """The object at `key` (a given version), or None when there is no such key."""
        found = self._get(key, version_id, None)
        assert found is not UNCHANGED
        return found

    def get_if_changed(self, key: str, etag: str) -> S3Object | None | Unchanged:
        """The object at `key`, None when there is none, or UNCHANGED when it still has
        `etag` (then no body is sent: a 304)."""
        return self._get(key, None, etag)

    def _get(
        self, key: str, version_id: str | None, unless_etag: str | None
    ) -> S3Object | None | Unchanged:
        from botocore.exceptions import BotoCoreError, ClientError

        extra: dict[str, str] = {"VersionId": version_id} if version_id else {}
        if unless_etag is not None:
            extra["IfNoneMatch"] = unless_etag
        client = self.client

        def request() -> tuple[dict[str, Any], bytes]:
            reply = client.get_object(Bucket=self.where.bucket, Key=key, **extra)
            return reply, reply["Body"].read()

        try:
            reply, body = self._within(request)
        except ClientError as err:
            code = _error_code(err)[0]
            if unless_etag is not None and code in ("304", "NotModified"):
                return UNCHANGED
            if code in ("NoSuchKey", "404") and not version_id:
                return None
            raise self._fail(key, "read", err) from None
        except BotoCoreError as err:  # IncompleteReadError: the body ended early
            raise self._fail(key, "read", err) from None
        return S3Object(
            body=body,
            etag=str(reply["ETag"]),
            metadata={k.lower(): v for k, v in reply.get("Metadata", {}).items()},
            version_id=reply.get("VersionId"),
            last_modified=reply.get("LastModified"),
        )

    def encryption(self) -> dict[str, str]:
        """Server-side encryption arguments: SSE-KMS with the key id when set, else SSE-S3."""
        if self.where.kms_key_id:
            return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.where.kms_key_id}
        return {"ServerSideEncryption": "AES256"}

    def put(self, key: str, body: bytes, *, expected: str | None, content_type: str) -> str:
        """Store `body` if the object's ETag is still `expected` (None: it must not exist;
        ANY_VERSION: unconditionally).

        Encrypted, with the body's sha256 in the metadata. Returns the new ETag; raises
        PreconditionFailed when the object changed.
        """
        condition: dict[str, str] = {}
        if expected is None:
            condition = {"IfNoneMatch": "*"}
        elif expected != ANY_VERSION:
            condition = {"IfMatch": expected}
        reply = self._call(
            key,
            "write",
            "put_object",
            Body=body,
            ContentType=content_type,
            Metadata={SHA256_META: sha256_hex(body)},
            **self.encryption(),
            **condition,
        )
        return str(reply["ETag"])

    def delete(self, key: str, *, expected: str) -> None:
        """Delete the object if its ETag is still `expected`; PreconditionFailed otherwise."""
        self._call(key, "delete", "delete_object", IfMatch=expected)

    def versioning_enabled(self) -> bool:
        """True when the bucket keeps old versions (GetBucketVersioning says Enabled)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client
        try:
            reply = self._within(lambda: client.get_bucket_versioning(Bucket=self.where.bucket))
        except ClientError as err:
            if _error_code(err)[0] == "AccessDenied":
                return False  # cannot tell: keep our own backup, which is always safe
            raise self._fail(self.where.key, "read the bucket's versioning", err) from None
        except BotoCoreError as err:
            raise self._fail(self.where.key, "read the bucket's versioning", err) from None
        return reply.get("Status") == "Enabled"

    def versions(self, key: str, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` versions of `key` (not delete markers), newest first."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client

        def request() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            pages = client.get_paginator("list_object_versions").paginate(
                Bucket=self.where.bucket, Prefix=key
            )
            for page in pages:
                found.extend(v for v in page.get("Versions", []) if v["Key"] == key)
                if len(found) >= limit:
                    break
            return found

        try:
            found = self._within(request)
        except (ClientError, BotoCoreError) as err:
            raise self._fail(key, "list the versions of", err) from None
        found.sort(key=lambda v: v["LastModified"], reverse=True)
        return found[:limit]
