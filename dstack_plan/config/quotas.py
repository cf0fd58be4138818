"""Quotas: per-namespace limits on GPUs, GPU-hours per day and hourly cost.

Quotas are policy, not resources: they are not planned or applied, they live in one file of
the project, `.dstack/quotas.yml`, which `dstack namespace` edits and plan and watch read::

    namespaces:
      dev:
        gpus: 20                 # GPUs held at once (a shared GPU counts its share)
        gpu_hours_per_day: 100   # per UTC day
        per_user: {gpus: 4, gpu_hours_per_day: 24}
        users:
          alice: {gpu_hours_per_day: 48}   # replaces per_user for alice
      prod: {gpus: 50, cost_per_hour: 200}

A run names its namespace with `namespace:` (unset: `default`); a namespace without an entry
has no limits. The pure checks are in `dstack_plan.scheduler.quotas`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from dstack_plan.config.base import ResourceName, Strict
from dstack_plan.config.project_name import ProjectName
from dstack_plan.config.settings_file import read_mapping, read_settings_text
from dstack_plan.config.validation_errors import PendingIssue
from dstack_plan.errors import ConfigError, DstackPlanError

QUOTAS_FILE = ".dstack/quotas.yml"
DEFAULT_NAMESPACE = "default"
"""The namespace of a run that names none."""
LIMIT_NAMES = ("gpus", "gpu_hours_per_day", "cost_per_hour")
_USER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@-")


def check_user(value: str) -> str:
    """`value` if it can name a user; else ValueError saying what can."""
    # user names come from the OS or CI (`alice`, `ci-bot`, `a.b@corp`): looser than names
    if not 1 <= len(value) <= 64 or not set(value) <= _USER_CHARS or value[0] in ".-@":
        raise ValueError(
            f"invalid user name {value!r}: use 1-64 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter, digit or '_'"
        )
    return value


UserName = Annotated[str, AfterValidator(check_user)]
Amount = Annotated[float, Field(ge=0, strict=True)]
"""A limit: a number >= 0 (0 allows none). Strict: `true` or `"20"` is no amount."""


class Limits(Strict):
    """Limits of a namespace or of one user in it; every field optional (None: no limit)."""

    gpus: Amount | None = None
    """GPUs held at once (a shared GPU counts its share)."""
    gpu_hours_per_day: Amount | None = None
    """GPU-hours used per UTC day; once used up, no run that needs GPUs starts."""
    cost_per_hour: Amount | None = None
    """Dollars per hour, summed over the running runs."""


class NamespaceQuota(Limits):
    """A namespace's own limits, and those of each user in it."""

    per_user: Limits | None = None
    """The same limits for each user."""
    users: dict[UserName, Limits] = {}
    """A user's own limits: they replace `per_user` for that user (not merged field by field,
    so that a user can be given no limit where `per_user` has one)."""

    def for_user(self, user: str) -> Limits | None:
        """The limits that apply to `user` in this namespace (None: none)."""
        own = self.users.get(user)
        return own if own is not None else self.per_user


Share = Annotated[
    Annotated[float, Field(strict=True)] | str, AfterValidator(lambda v: check_share(v) and v)
]
"""A guaranteed share of the exported fleets' GPUs: a GPU count, or a percent (`50%`)."""


def check_share(value: float | str) -> bool:
    """Whether `value` is a share (a count >= 0 or `N%` with 0 <= N <= 100); ValueError
    saying what one is otherwise."""
    if isinstance(value, str):
        number = value.removesuffix("%")
        try:
            pct = float(number)
        except ValueError:
            pct = -1.0
        if not value.endswith("%") or not 0 <= pct <= 100:
            raise ValueError(f"expected a GPU count or a percent such as 50%, got {value!r}")
    elif value < 0:
        raise ValueError(f"must be at least 0, got {value}")
    return True


class ProjectQuota(Limits):
    """Another project's limits on this project's exported fleets (the same three as a
    namespace's, counted over the importer's runs there), and its fair share of them."""

    guarantee: Share | None = None
    """GPUs of the exported fleets the project is guaranteed: borrowed ones are reclaimed
    for it (by preemption) while it is under this and has work waiting."""
    borrowing_limit: Amount | None = None
    """GPUs beyond its guarantee it may borrow while they are idle (None: any)."""


class Quotas(Strict):
    """The project's quota file."""

    namespaces: dict[ResourceName, NamespaceQuota] = {}
    projects: dict[ProjectName, ProjectQuota] = {}
    """Limits and fair shares of the projects this one exports fleets to (and of itself, by
    its own name): published in its state by apply, for importers to obey."""

    def for_namespace(self, name: str) -> NamespaceQuota | None:
        """The quota of namespace `name`; None when it has none (no limits)."""
        return self.namespaces.get(name)


def namespace_of(spec: Mapping[str, Any]) -> str:
    """The namespace of a run from its normalised spec (as state and plans keep it)."""
    return str(spec.get("namespace") or DEFAULT_NAMESPACE)


def quotas_path(project_dir: str | Path) -> Path:
    return Path(project_dir) / QUOTAS_FILE


def load_quotas(project_dir: str | Path) -> Quotas:
    """The project's quotas: `Quotas()` when it has no quota file; ConfigError locating every
    problem (FILE:LINE:COL) when the file is invalid."""
    text = read_settings_text(project_dir, QUOTAS_FILE)
    return Quotas() if text is None else parse_quotas(text)


def parse_quotas(text: str, display: str = QUOTAS_FILE) -> Quotas:
    """The quotas in `text` (a quota file's content); ConfigError as `load_quotas`."""
    document = read_mapping(text, display, "namespaces", required=False)
    if document is None:
        return Quotas()
    quotas = document.validate(Quotas, target_of=_target)
    document.raise_issues()
    return quotas


def _target(issue: PendingIssue) -> Any:
    # a bad mapping key (a namespace or user name) is about the key, not its value
    bad_key = issue.message.split(": ", 1)[-1].startswith(_KEY_ERRORS)
    return "key" if bad_key else issue.target


_KEY_ERRORS = ("invalid name ", "invalid user name ", "invalid project name ")
"""How the messages about a bad namespace or user name start (see `check_user`)."""

QuotasEdit = Callable[[Any], None]
"""Changes the round-trip (ruamel.yaml) data of the quota file in place."""


def save_quotas(project_dir: str | Path, edit: QuotasEdit) -> Quotas:
    """Apply `edit` to the quota file (created if missing) and write it back.

    The file is read and written with ruamel.yaml's round-trip loader, so a user's comments,
    key order and quoting survive. The result is validated before anything is written (an
    edit never leaves an invalid file) and written atomically (temp file, then rename).
    Returns the new quotas.
    """
    from ruamel.yaml import YAML  # noqa: PLC0415 - only `dstack namespace` edits the file
    from ruamel.yaml.comments import CommentedMap  # noqa: PLC0415

    path = quotas_path(project_dir)
    yaml_rt = YAML(typ="rt")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    load_quotas(project_dir)  # refuse to edit a broken file: say where it is broken first
    data = yaml_rt.load(text) if text.strip() else None
    if data is None:
        data = CommentedMap()
    if data.get("namespaces") is None:
        data["namespaces"] = CommentedMap()
    edit(data)
    out = _dump(yaml_rt, data)
    try:
        quotas = parse_quotas(out)
    except ConfigError as e:
        raise DstackPlanError(f"the change would make {QUOTAS_FILE} invalid: {e}") from None
    _write_atomic(path, out)
    return quotas


def _dump(yaml_rt: Any, data: Any) -> str:
    import io  # noqa: PLC0415

    out = io.StringIO()
    yaml_rt.dump(data, out)
    return out.getvalue()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".quotas-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
