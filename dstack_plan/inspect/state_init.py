"""`dstack init --backend ...`: the `.dstack/backend.yml` the flags describe, and when to
refuse writing it (a local state with resources would be left behind)."""

from __future__ import annotations

from pathlib import Path

from dstack_plan.errors import DstackPlanError
from dstack_plan.state.backend_config import (
    BACKEND_FILE,
    BackendConfig,
    LocalBackendConfig,
    S3BackendConfig,
    load_backend_config,
    save_backend_config,
)
from dstack_plan.state.local import DEFAULT_STATE_PATH, LocalBackend
from dstack_plan.state.select import describe, where_of_config

_S3_ONLY = ("bucket", "key", "region", "endpoint_url", "profile", "kms_key_id")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def backend_config_from_flags(
    backend: str | None,
    *,
    bucket: str | None,
    key: str | None,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    kms_key_id: str | None,
    path: str | None,
) -> BackendConfig:
    """The settings `dstack init --backend ...` asks for; DstackPlanError for a flag that
    does not go with the backend or a missing one."""
    s3_flags = {
        "bucket": bucket,
        "key": key,
        "region": region,
        "endpoint_url": endpoint_url,
        "profile": profile,
        "kms_key_id": kms_key_id,
    }
    if backend is None:
        raise DstackPlanError("--backend is needed with the backend flags: --backend s3 or local")
    if backend == "local":
        given = [_flag(n) for n in _S3_ONLY if s3_flags[n] is not None]
        if given:
            raise DstackPlanError(f"{', '.join(given)}: only for --backend s3")
        return LocalBackendConfig(backend="local", path=path)
    if backend != "s3":
        raise DstackPlanError(f"--backend: expected s3 or local, got {backend!r}")
    if path is not None:
        raise DstackPlanError("--path: only for --backend local (s3 takes --bucket and --key)")
    missing = [_flag(n) for n in ("bucket", "key") if not s3_flags[n]]
    if missing:
        raise DstackPlanError(f"--backend s3 needs {' and '.join(missing)}")
    config = S3BackendConfig(backend="s3", **s3_flags)  # type: ignore[arg-type]
    where_of_config(".", config)  # the same checks as an s3:// URL: bucket name, key
    return config


def check_switch(project_dir: Path, config: BackendConfig) -> None:
    """DstackPlanError when the project's local state holds resources and `config` names
    another place: they would be left behind, unmanaged (`state migrate` moves them)."""
    current = load_backend_config(project_dir)
    here = (
        where_of_config(project_dir, current)
        if current is not None
        else project_dir / DEFAULT_STATE_PATH
    )
    if not isinstance(here, Path):
        return
    if describe(here) == describe(where_of_config(project_dir, config)):
        return
    held = LocalBackend(here).read().state.addresses
    if held:
        raise DstackPlanError(
            f"the local state {here} holds {len(held)} resource(s); switching would leave them"
            " unmanaged. Copy them to the new backend with `dstack state migrate --to ...`"
            " (it writes .dstack/backend.yml itself), or destroy them first."
        )


def save(project_dir: Path, config: BackendConfig) -> str:
    """Write `.dstack/backend.yml`; the sentence saying so."""
    save_backend_config(project_dir, config)
    where = describe(where_of_config(project_dir, config))
    return f"Wrote {BACKEND_FILE}: the state lives at {where}."
