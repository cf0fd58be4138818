"""State: the model, backends (`local`; `s3` later), the operation lock and CAS commits.

This package knows resource addresses (`<kind>.<name>`), never what a kind means.
"""

from dstack_plan.state.backend import (
    ABSENT,
    StateBackend,
    StateConflictError,
    StateSnapshot,
    prepare_write,
)
from dstack_plan.state.canonical import canonical_json, spec_hash
from dstack_plan.state.codec import parse_state
from dstack_plan.state.commit import Mutation, commit, commit_async
from dstack_plan.state.local import DEFAULT_STATE_PATH, LocalBackend, LocalLockHandle
from dstack_plan.state.lock import (
    DEFAULT_LOCK_TTL,
    LockHandle,
    LockInfo,
    acquire_with_backoff,
    default_who,
    hold_lock,
)
from dstack_plan.state.model import (
    FORMAT_VERSION,
    ResourceState,
    State,
    parse_address,
    timestamp,
)
from dstack_plan.state.secrets import SecretGuard, assert_no_secret_values

__all__ = [
    "ABSENT",
    "DEFAULT_LOCK_TTL",
    "DEFAULT_STATE_PATH",
    "FORMAT_VERSION",
    "LocalBackend",
    "LocalLockHandle",
    "LockHandle",
    "LockInfo",
    "Mutation",
    "ResourceState",
    "SecretGuard",
    "State",
    "StateBackend",
    "StateConflictError",
    "StateSnapshot",
    "acquire_with_backoff",
    "assert_no_secret_values",
    "canonical_json",
    "commit",
    "commit_async",
    "default_who",
    "hold_lock",
    "parse_address",
    "parse_state",
    "prepare_write",
    "spec_hash",
    "timestamp",
]
