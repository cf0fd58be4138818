"""How a project is named where other projects name it (`.dstack/projects.yml`, exports,
`.dstack/quotas.yml`'s `projects:`): its directory's name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

_PROJECT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def check_project_name(value: str) -> str:
    """`value` if it can name a project; else ValueError saying what can."""
    if not _PROJECT_NAME.fullmatch(value):
        raise ValueError(
            f"invalid project name {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter, digit or '_'"
        )
    return value


ProjectName = Annotated[str, AfterValidator(check_project_name)]


def own_project_name(project_dir: str | Path) -> str:
    """The name other projects know the project in `project_dir` by: its directory's."""
    return Path(project_dir).resolve().name or "project"
