"""`.dstack/backend.yml`: which state backend a project uses (written by `dstack init`).

    backend: s3                 # or: local
    bucket: team-state
    key: projects/train/state.json
    region: eu-west-1
    endpoint_url: https://s3.example.com   # optional: an S3-compatible store
    profile: ci                 # optional: a profile of ~/.aws/config
    kms_key_id: alias/state     # optional: SSE-KMS instead of SSE-S3

`backend: local` takes an optional `path` (relative to the project directory). There is no
credentials field on purpose: credentials come from boto3's own chain (environment, profile,
instance role), never from the project. Problems are ConfigErrors located FILE:LINE:COL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from dstack_plan.config.atomic import write_private_atomic
from dstack_plan.config.base import Strict
from dstack_plan.config.settings_file import read_mapping, read_settings_text
from dstack_plan.config.validation_errors import PendingIssue
from dstack_plan.errors import ConfigError

BACKEND_FILE = ".dstack/backend.yml"
_SECRET_LOOKING = re.compile(r"secret|password|token|credential|access_key|session", re.I)


class S3BackendConfig(Strict):
    """State in one S3 object (see docs/state.md#the-s3-backend)."""

    backend: Literal["s3"]
    bucket: str
    key: str
    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    kms_key_id: str | None = None


class LocalBackendConfig(Strict):
    """State in a local file; `path` relative to the project (default .dstack/state.json)."""

    backend: Literal["local"]
    path: str | None = None


BackendConfig = S3BackendConfig | LocalBackendConfig
_MODELS: dict[str, type[BaseModel]] = {"s3": S3BackendConfig, "local": LocalBackendConfig}


def backend_file(project_dir: str | Path) -> Path:
    """`<project_dir>/.dstack/backend.yml`."""
    return Path(project_dir) / BACKEND_FILE


def load_backend_config(project_dir: str | Path) -> BackendConfig | None:
    """The project's backend settings; None when it has no `.dstack/backend.yml`."""
    text = read_settings_text(project_dir, BACKEND_FILE)
    return None if text is None else parse_backend_config(text)


def parse_backend_config(text: str, display: str = BACKEND_FILE) -> BackendConfig:
    """The settings in `text` (a backend.yml's content); ConfigError locating each problem."""
    document = read_mapping(text, display, "backend", required=True)
    assert document is not None  # required: a file with no document is an error
    kind = document.data.get("backend")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        message = (
            "missing required key 'backend' (s3 or local)"
            if kind is None
            else f"backend: expected 's3' or 'local', got {kind!r}"
        )
        path: tuple[str, ...] = () if kind is None else ("backend",)
        document.issues += document.locate([PendingIssue(0, path, message)])
        raise ConfigError(document.issues)
    config: BackendConfig = document.validate(model)  # type: ignore[assignment]
    document.raise_issues()
    return config


def _credentials_hint(path: tuple[Any, ...]) -> str:
    if len(path) == 1 and isinstance(path[0], str) and _SECRET_LOOKING.search(path[0]):
        return (
            ": credentials never go in the project; boto3 reads them from its own chain"
            " (environment variables, ~/.aws and `profile`, an instance role)"
        )
    return ""


def render_backend_config(config: BackendConfig) -> str:
    """The YAML text of `config` (the fields that are set, in the documented order)."""
    fields = config.model_dump(exclude_none=True)
    return yaml.safe_dump(fields, sort_keys=False, default_flow_style=False)


def save_backend_config(project_dir: str | Path, config: BackendConfig) -> Path:
    """Write `.dstack/backend.yml` atomically (creating `.dstack/` private if missing)."""
    path = backend_file(project_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = "# dstack-plan: where this project's state lives (dstack init --backend)\n"
    write_private_atomic(path, (text + render_backend_config(config)).encode("utf-8"))
    return path
