"""Where an S3 state lives: bucket, key and connection settings, and its `s3://` URL.

`s3://bucket/path/state.json?region=R&endpoint_url=URL&profile=P&kms_key_id=K`. Credentials
never appear here: they come only from boto3's own chain (environment, profile, instance
role), so a URL can be printed, logged and stored in `.dstack/backend.yml` safely.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from dstack_plan.errors import StateError

# The query parameters a URL may carry, in the order `url()` writes them.
PARAMETERS = ("region", "endpoint_url", "profile", "kms_key_id")
_SECRET_LOOKING = re.compile(r"secret|password|passwd|token|credential|access_key|session", re.I)
# S3's rules for new buckets: 3-63 of [a-z0-9.-], starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+\Z")


def _check_bucket(bucket: str, url: str) -> None:
    if not _BUCKET.match(bucket) or ".." in bucket or _IP_ADDRESS.match(bucket):
        raise StateError(
            f"{url}: invalid bucket name {bucket!r}: S3 bucket names are 3-63 characters of"
            " lowercase letters, digits, dots and hyphens, starting and ending with a letter"
            " or digit"
        )


def _check_key(key: str, url: str) -> None:
    if not key or key.endswith("/"):
        raise StateError(
            f"{url}: no object key: give the state object's path, e.g. s3://bucket/team/state.json"
        )
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise StateError(f"{url}: invalid object key {key!r}: empty, '.' or '..' path segment")


class S3Location(NamedTuple):
    """An S3 state object and how to reach it (never with credentials)."""

    bucket: str
    key: str
    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    kms_key_id: str | None = None

    @classmethod
    def from_url(cls, url: str) -> S3Location:
        """Parse `s3://bucket/key?region=..&endpoint_url=..&profile=..&kms_key_id=..`.

        Raises StateError naming the URL and what is wrong: not s3://, no key, a bad bucket
        name, an unknown or repeated parameter, or credentials in the URL (they must come
        from boto3's credential chain).
        """
        shown = url.split("?", 1)[0] if "@" in url.split("?", 1)[0] else url
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise StateError(f"{shown}: not an S3 state URL (expected s3://bucket/key)")
        if "@" in parts.netloc:
            # never echo what came before the @: it may be a key pair
            raise StateError(
                f"s3://...@{parts.netloc.rsplit('@', 1)[1]}{parts.path}: credentials in the"
                " URL are refused; boto3 reads them from its own chain (environment"
                " variables, ~/.aws, an instance role)"
            )
        bucket = parts.netloc
        if parts.fragment:
            raise StateError(f"{url}: unexpected '#' fragment in an S3 state URL")
        _check_bucket(bucket, url)
        key = unquote(parts.path.removeprefix("/"))
        _check_key(key, url)
        options: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if _SECRET_LOOKING.search(name):
                raise StateError(
                    f"s3://{bucket}/{key}: refusing the query parameter {name!r}: credentials"
                    " never go in the URL; boto3 reads them from its own chain"
                )
            if name not in PARAMETERS:
                raise StateError(
                    f"{url}: unknown query parameter {name!r}; known: {', '.join(PARAMETERS)}"
                )
            if name in options:
                raise StateError(f"{url}: query parameter {name!r} given twice")
            if not value:
                raise StateError(f"{url}: query parameter {name!r} is empty")
            options[name] = value
        return cls(bucket=bucket, key=key, **options)

    def validated(self) -> S3Location:
        """`self` after the checks `from_url` makes (for locations built from fields)."""
        return S3Location.from_url(self.url())

    def url(self) -> str:
        """The canonical `s3://` URL, with the query parameters that are set."""
        base = f"s3://{self.bucket}/{quote(self.key, safe='/')}"
        query = [(name, getattr(self, name)) for name in PARAMETERS if getattr(self, name)]
        return f"{base}?{urlencode(query, safe=':/')}" if query else base

    @property
    def object_url(self) -> str:
        """`s3://bucket/key`: the object alone, for messages."""
        return f"s3://{self.bucket}/{self.key}"
