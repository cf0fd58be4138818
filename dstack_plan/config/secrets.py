"""Secret values: read at apply time from the environment or `.dstack/secrets.yml`.

Values travel as `Secret` objects whose str/repr is `(sensitive)`; only the code that hands a
job to its agent calls `reveal()`. State, plans and output only ever hold secret names.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from dstack_plan.errors import DstackPlanError

SECRETS_FILE = Path(".dstack") / "secrets.yml"
ENV_PREFIX = "DSTACK_SECRET_"


class Secret:
    """A secret value that does not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "(sensitive)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class SecretStore:
    """Secrets by name: `DSTACK_SECRET_<NAME>` wins over the project's secrets file."""

    def __init__(
        self,
        project_dir: str | Path = ".",
        environ: Mapping[str, str] | None = None,
        on_resolve: Callable[[str], None] | None = None,
    ):
        self._file = Path(project_dir) / SECRETS_FILE
        self._environ = os.environ if environ is None else environ
        self._from_file: dict[str, str] | None = None
        self._on_resolve = on_resolve
        """Told every value handed out, so the state backend can refuse to store it."""

    def get(self, name: str) -> Secret:
        value = self._environ.get(ENV_PREFIX + name)
        if value is None:
            value = self._file_values().get(name)
        if value is None:
            raise DstackPlanError(
                f"secret {name!r} is not set: export {ENV_PREFIX}{name}=... or add "
                f"`{name}: ...` to {SECRETS_FILE} (mode 0600)"
            )
        if self._on_resolve is not None:
            self._on_resolve(value)
        return Secret(value)

    def values(self, names: set[str] | frozenset[str] | tuple[str, ...]) -> dict[str, Secret]:
        return {name: self.get(name) for name in names}

    def _file_values(self) -> dict[str, str]:
        if self._from_file is None:
            self._from_file = _read_secrets_file(self._file)
        return self._from_file


def _read_secrets_file(path: Path) -> dict[str, str]:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {}
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DstackPlanError(
            f"{path} is readable by others (mode {stat.filemode(mode)}); "
            f"run `chmod 600 {path}` first"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise DstackPlanError(f"{where}: invalid YAML in secrets file") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise DstackPlanError(f"{path}: expected a mapping of secret names to values")
    return {k: str(v) for k, v in data.items() if v is not None}
