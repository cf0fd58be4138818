"""Helpers shared by the s3 backend's tests (moto server on loopback, real boto3)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from dstack_plan.state import ResourceState, SecretGuard, State
from dstack_plan.state.s3 import S3Backend
from dstack_plan.state.s3_location import S3Location
from tests.infra.moto_server import S3Bucket

NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)
KEY = "team/state.json"


def s3_backend(
    bucket: S3Bucket,
    key: str = KEY,
    *,
    secret_guard: SecretGuard | None = None,
    client: Any | None = None,
    **where: str,
) -> S3Backend:
    """A backend of `key` in `bucket`, built from its URL as the CLI does."""
    location = S3Location.from_url(bucket.url(key))._replace(**where)
    return S3Backend(location, secret_guard=secret_guard, client=client)


def add(address: str, **spec: object) -> Callable[[State], State]:
    """A mutation adding (or replacing) `address` with `spec`."""

    def mutate(state: State) -> State:
        rs = ResourceState.create(address, provider="local", spec=spec, status="ok", now=NOW)
        return state.with_resource(rs)

    return mutate


def state_of(*addresses: str) -> State:
    """A fresh state (new lineage) holding `addresses`."""
    state = State.empty()
    for address in addresses:
        state = add(address)(state)
    return state
