"""S3 for tests: moto's server on 127.0.0.1 (real HTTP; boto3 reaches it through
`endpoint_url`, never AWS), started once per session, a fresh bucket per test.

The credentials are moto's dummies, put in the environment of the test process and of every
CLI subprocess (`S3Bucket.env`), so boto3's credential chain finds them before it would ever
ask an instance metadata service; that lookup is disabled too.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
_buckets = itertools.count()


def available() -> str | None:
    """None when moto's server and boto3 can be imported, else why not."""
    try:
        import boto3  # noqa: F401
        from moto.server import ThreadedMotoServer  # noqa: F401
    except ImportError as e:
        return f"moto[server] and boto3 are needed for the S3 tests: {e}"
    return None


def _one_request_at_a_time(server: Any) -> None:
    """Serve one request at a time. S3 applies a conditional PutObject (`If-Match`,
    `If-None-Match`) atomically; moto checks and writes in two steps, so two threads may both
    pass the check and a compare-and-swap test would see a write lost that S3 never loses.
    The listener stays threaded (a slow client blocks no accept); the backend is serialised,
    each response read whole inside the lock."""
    wsgi = server._server  # werkzeug's server: its handler calls `self.server.app` per request
    inner = wsgi.app
    lock = threading.Lock()

    def serialised(environ: Any, start_response: Any) -> list[bytes]:
        with lock:
            return list(inner(environ, start_response))

    wsgi.app = serialised


class MotoServer:
    """moto's threaded server, on a free loopback port, one request served at a time."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request
        os.environ.update(CREDENTIALS)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        _one_request_at_a_time(self._server)
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"

    def client(self) -> Any:
        """A boto3 S3 client of the server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION)

    def bucket(self, versioning: bool = False) -> S3Bucket:
        """A new, empty bucket (optionally versioned) for one test."""
        name = f"dstack-test-{os.getpid()}-{next(_buckets)}"
        client = self.client()
        client.create_bucket(Bucket=name)
        if versioning:
            client.put_bucket_versioning(
                Bucket=name, VersioningConfiguration={"Status": "Enabled"}
            )
        return S3Bucket(self, name)

    def stop(self) -> None:
        self._server.stop()


@dataclass(frozen=True)
class S3Bucket:
    """A test's bucket on the moto server."""

    server: MotoServer
    name: str

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    def url(self, key: str = "team/state.json") -> str:
        """The `s3://` state URL of `key` in this bucket (as `DSTACK_STATE` or `--state`)."""
        return f"s3://{self.name}/{key}?region={REGION}&endpoint_url={self.endpoint_url}"

    @property
    def env(self) -> dict[str, str]:
        """What a CLI subprocess needs in its environment to reach the bucket."""
        return dict(CREDENTIALS)

    def client(self) -> Any:
        return self.server.client()
