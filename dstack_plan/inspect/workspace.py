"""`dstack init`: a project's private `.dstack/` directory, kept out of git but for the
files a team shares: where the state is (`backend.yml`) and the quotas (`quotas.yml`)."""

from __future__ import annotations

import stat
from pathlib import Path

from dstack_plan.errors import DstackPlanError

DSTACK_DIR = ".dstack"
IGNORE_LINES = (
    ".dstack/*",
    "!.dstack/backend.yml",
    "!.dstack/backends.yml",
    "!.dstack/quotas.yml",
    "!.dstack/policies/",
)
"""The state, its backups, history and locks, and `secrets.yml` stay out of git; the backend
files (`backend.yml`: where the state is; `backends.yml`: the clouds, docs/backends.md), the
quotas file and the policies (`policies/`, docs/policies.md) are what a team reviews and
shares (a pattern on the directory itself, `.dstack/`, would keep git from re-including them)."""
_BACKENDS_LINE = "!.dstack/backends.yml"
_ALREADY_IGNORED = frozenset({".dstack", ".dstack/", "/.dstack", "/.dstack/", ".dstack/*"})
_PRIVATE = 0o700


def init_workspace(directory: str | Path = ".") -> list[str]:
    """Create `<directory>/.dstack/` (mode 0700) and ignore it in `.gitignore`.

    Idempotent. Returns what was done, one sentence each (empty when nothing was needed).
    """
    base = Path(directory)
    if not base.is_dir():
        raise DstackPlanError(f"{base}: not a directory")
    done: list[str] = []
    private = base / DSTACK_DIR
    try:
        if not private.is_dir():
            private.mkdir(mode=_PRIVATE)
            done.append(f"created {DSTACK_DIR}/ (mode 0700)")
        if stat.S_IMODE(private.stat().st_mode) != _PRIVATE:
            # it holds state and secrets: nobody else may read it
            private.chmod(_PRIVATE)
            done.append(f"made {DSTACK_DIR}/ private (mode 0700)")
        added = _add_ignore(base / ".gitignore")
        if added:
            done.append(added)
    except OSError as e:
        raise DstackPlanError(f"{base}: cannot initialise: {e}") from None
    return done


def _add_ignore(gitignore: Path) -> str | None:
    """Add the ignore lines to `gitignore` unless it already ignores `.dstack`; what was done."""
    text = gitignore.read_text() if gitignore.exists() else ""
    lines = {line.strip() for line in text.splitlines()}
    if lines & _ALREADY_IGNORED:
        if ".dstack/*" in lines and _BACKENDS_LINE not in lines:
            # written by an older init, before backends.yml existed: let the team commit it
            prefix = "\n" if text and not text.endswith("\n") else ""
            with gitignore.open("a") as f:
                f.write(f"{prefix}{_BACKENDS_LINE}\n")
            return f"added {_BACKENDS_LINE} to .gitignore"
        return None
    prefix = "\n" if text and not text.endswith("\n") else ""
    comment = "# dstack-plan: state, backups, locks, secrets; not backends, quotas or policies\n"
    with gitignore.open("a") as f:
        f.write(prefix + comment + "".join(f"{line}\n" for line in IGNORE_LINES))
    return (
        f"added {IGNORE_LINES[0]} to .gitignore (but backend.yml, backends.yml, quotas.yml,"
        " policies/)"
    )
