"""Which state backend a project uses, and opening it.

In order: `--state` (a path or an `s3://` URL), then `$DSTACK_STATE` (the same two forms; CI
sets it), then the project's `.dstack/backend.yml`, then the local default
`.dstack/state.json`. Every command that reads or writes state comes through
`open_backend`, so they all agree. boto3 is imported only when the S3 backend is opened.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Union

from dstack_plan.state.local import DEFAULT_STATE_PATH, STATE_ENV, LocalBackend

if TYPE_CHECKING:
    from dstack_plan.state.backend import StateBackend
    from dstack_plan.state.backend_config import BackendConfig
    from dstack_plan.state.s3_location import S3Location
    from dstack_plan.state.secrets import SecretGuard

S3_SCHEME = "s3://"
Where = Union[Path, "S3Location"]
"""A state's place: a local file, or an S3 object."""


class Choice(NamedTuple):
    """Where the state is and what said so (for messages: `--state`, `DSTACK_STATE`...)."""

    where: Where
    source: str


def parse_where(text: str, base: str | Path = ".") -> Where:
    """`s3://bucket/key?...` as an S3Location, anything else as a path (relative to `base`
    unless absolute). StateError for a malformed `s3://` URL."""
    if text.startswith(S3_SCHEME):
        from dstack_plan.state.s3_location import S3Location  # noqa: PLC0415 - S3 only

        return S3Location.from_url(text)
    path = Path(text).expanduser()
    return path if path.is_absolute() else Path(base) / path


def where_of_config(project_dir: str | Path, config: BackendConfig) -> Where:
    """The place `.dstack/backend.yml` names."""
    from dstack_plan.state.backend_config import S3BackendConfig  # noqa: PLC0415

    if isinstance(config, S3BackendConfig):
        from dstack_plan.state.s3_location import S3Location  # noqa: PLC0415 - S3 only

        given = S3Location(
            bucket=config.bucket,
            key=config.key,
            region=config.region,
            endpoint_url=config.endpoint_url,
            profile=config.profile,
            kms_key_id=config.kms_key_id,
        )
        return S3Location.from_url(given.url())  # the checks a URL gets: bucket name, key
    if config.path is None:
        return Path(project_dir) / DEFAULT_STATE_PATH
    return parse_where(config.path, project_dir)


def choose(project_dir: str | Path, explicit: str | Path | None = None) -> Choice:
    """Where the project's state is, by the order in the module docstring."""
    if explicit:
        # as before: a relative --state path is relative to the working directory
        return Choice(parse_where(str(explicit)), "--state")
    from_env = os.environ.get(STATE_ENV)
    if from_env:
        return Choice(parse_where(from_env), STATE_ENV)
    if (Path(project_dir) / ".dstack" / "backend.yml").exists():
        from dstack_plan.state.backend_config import BACKEND_FILE, load_backend_config  # noqa: PLC0415

        config = load_backend_config(project_dir)
        if config is not None:
            return Choice(where_of_config(project_dir, config), BACKEND_FILE)
    return Choice(Path(project_dir) / DEFAULT_STATE_PATH, "default")


def backend_at(where: Where, *, secret_guard: SecretGuard | None = None) -> StateBackend:
    """The backend of the state at `where`."""
    if isinstance(where, Path):
        return LocalBackend(where, secret_guard=secret_guard)
    from dstack_plan.state.s3 import S3Backend  # noqa: PLC0415 - imports boto3

    return S3Backend(where, secret_guard=secret_guard)


def open_backend(
    project_dir: str | Path,
    explicit: str | Path | None = None,
    *,
    secret_guard: SecretGuard | None = None,
) -> StateBackend:
    """The state backend of the project in `project_dir` (`explicit`: the `--state` value)."""
    return backend_at(choose(project_dir, explicit).where, secret_guard=secret_guard)


def describe(where: Where) -> str:
    """`where` for messages: the path, or the canonical `s3://` URL."""
    return str(where) if isinstance(where, Path) else where.url()
