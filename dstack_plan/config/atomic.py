"""Crash-safe file replacement: readers see the old bytes or the new bytes, never a mix.

The state's local backend commits through it, and so does every other writer of a project's
files (settings files, offer caches, tokens). It lives in `config/` (which `state/` may import,
never the reverse) so that config's own writers (`.dstack/backends.yml`) can use it too."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

PRIVATE_MODE = 0o600


def temp_path_for(path: Path) -> Path:
    """A unique hidden sibling of `path`; same directory, so rename is atomic."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def leftover_temp_files(path: Path) -> list[Path]:
    """Temp files of `path` left behind by writers that died mid-write."""
    return sorted(path.parent.glob(f".{path.name}.tmp-*"))


def fsync_dir(directory: Path) -> None:
    """Persist directory entries (renames, links), so a power loss keeps the new name."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private_atomic(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace `path` with `data`: temp file (mode 0600 from creation), fsync, rename.

    With `sync_dir` the directory is fsynced too, so the rename itself is durable.
    """
    write_atomic(path, data, mode=PRIVATE_MODE, sync_dir=sync_dir)


def write_atomic(path: Path, data: bytes, *, mode: int, sync_dir: bool = True) -> None:
    """`write_private_atomic` with the file's `mode` chosen (exactly that, from creation)."""
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        # The umask can only narrow the mode; make it exactly `mode` before any byte lands.
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)
