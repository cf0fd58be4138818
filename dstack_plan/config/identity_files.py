"""Where an SSH fleet's `identity_file` points: one rule for the SSH provider, which reads the
key, and for `plan`, which checks beforehand that it can be read (`plan/host_checks.py`)."""

from __future__ import annotations

from pathlib import Path


def identity_path(value: str) -> Path:
    """The file an `identity_file` value names: `~` and `~user` expanded, as `ssh -i` does; a
    relative path is relative to the directory the command runs in (not the config file's),
    as it is for `ssh -i` and for dstack's CLI, which reads the key where it runs."""
    return Path(value).expanduser()
