"""Finding a project's configuration files: a walk of its directory that never fails.

Paths that cannot be read are skipped with one warning each; version control, state and
virtualenv directories are skipped quietly; mounts of kernel pseudo file systems (`/proc`,
`/sys`, cgroups...) are never entered, so `dstack validate /` reads only real files. Symlinked
directories are not followed (a link back up the tree would loop); symlinked files are read.
FIFOs, sockets and devices with a config's name are skipped with a warning.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", ".dstack", ".venv", "venv", "node_modules", "__pycache__",
    ".tox", ".nox", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
})  # fmt: skip
CONFIG_SUFFIXES = (".dstack.yml", ".dstack.yaml")
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
    "tracefs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "binfmt_misc",
    "autofs", "efivarfs", "selinuxfs", "rpc_pipefs", "nsfs",
})  # fmt: skip
"""Kernel file systems that hold no user files. tmpfs is not among them: it can (`/tmp`)."""
MOUNTS_FILE = "/proc/self/mounts"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

Warn = Callable[[str], None]


def is_config_file(filename: str) -> bool:
    """`.dstack.yml`, or `NAME.dstack.yml` (`.yaml` too); not hidden `.NAME.dstack.yml`."""
    return filename in (".dstack.yml", ".dstack.yaml") or (
        filename.endswith(CONFIG_SUFFIXES) and not filename.startswith(".")
    )


def discover(directory: Path, warn: Warn | None = None) -> list[Path]:
    """Every configuration file below `directory`, in sorted walk order (see module doc).

    Each unreadable path is reported once to `warn` (default: a logging warning).
    """
    return list(iter_config_files(directory, warn))


def has_config_files(directory: Path) -> bool:
    """Whether `directory` holds any configuration file (stops at the first one found)."""
    return next(iter_config_files(directory, warn=lambda message: None), None) is not None


def iter_config_files(directory: Path, warn: Warn | None = None) -> Iterator[Path]:
    """`discover`, lazily: files as the walk reaches them."""
    report = warn or logger.warning
    skip = pseudo_mounts()

    def unreadable(error: OSError) -> None:
        report(f"skipped {error.filename}: cannot read it ({error.strerror or error})")

    if os.path.abspath(directory) in skip:
        return
    for root, dirs, files in os.walk(directory, onerror=unreadable):
        kept = []
        for name in sorted(dirs):
            path = os.path.join(root, name)
            if name in SKIP_DIRS or os.path.abspath(path) in skip:
                continue
            # os.path.exists, not Path.exists: an unreadable directory is no virtualenv, and
            # Path.exists raises PermissionError there (proc/1/fdinfo, as root too)
            if os.path.exists(os.path.join(path, "pyvenv.cfg")):
                continue  # a virtualenv under another name
            kept.append(name)
        dirs[:] = kept
        for name in sorted(files):
            if is_config_file(name) and not _special(os.path.join(root, name), report):
                yield Path(root, name)


def _special(path: str, report: Warn) -> bool:
    """Whether `path` is a FIFO, socket or device (reading a FIFO would wait forever for a
    writer): reported and skipped. A path that cannot be stat'ed is left to the reader,
    whose error names it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISREG(mode):
        return False
    report(f"skipped {path}: not a regular file")
    return True


def pseudo_mounts() -> frozenset[str]:
    """Mount points of kernel pseudo file systems on this machine (none if unknown)."""
    return _read_pseudo_mounts(MOUNTS_FILE)


@lru_cache(maxsize=4)
def _read_pseudo_mounts(mounts_file: str) -> frozenset[str]:
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as f:
            return parse_pseudo_mounts(f.read())
    except OSError:  # not Linux, or no /proc: nothing to skip by file system type
        return frozenset()


def parse_pseudo_mounts(text: str) -> frozenset[str]:
    """The mount points of `PSEUDO_FILESYSTEMS` in /proc/self/mounts text (fstab format,
    where a space in a path is written `\\040`)."""
    points = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in PSEUDO_FILESYSTEMS:
            points.add(_OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[1]))
    return frozenset(points)
