"""A run's local `files:` and `repos:` as one deterministic tar.gz, and its fingerprint.

Members are named `wd/<path>` (relative to the job's working dir), `home/<path>` (`~/...`)
and `abs/<path>` (absolute), so the agent places each without guessing (see
`dstack_plan/agent/blobs.py`). Entries are sorted, with mtime 0, owner 0:0 and modes reduced
to 0644/0755, or 0600/0700 for a file only its owner may read here: the same content always
gives the same bytes, whatever the files' times. What is never sent (`.dstack/`, the state's
directory, symlinks out of a sent directory) is decided by `code_sources`.

`code_fingerprint` is what a plan compares: a digest of names, modes and content hashes
(not of the compressed bytes, which depend on the zlib build), cheap to repeat because file
hashes are cached by (path, size, mtime_ns).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstack_plan.config.runs import RunSpec
from dstack_plan.runs.code_sources import (
    CodeError,
    Entry,
    PrivatePaths,
    collect,
    local_sources,
    private_paths,
)

DEFAULT_LIMIT = 100 * 1024 * 1024
"""Uncompressed bytes a run may send; more is almost always data that belongs in a volume."""
_BIGGEST_SHOWN = 5
_READ_SIZE = 1024 * 1024

_hash_cache: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class CodeArchive:
    """The packed code of one run, as uploaded to agents (by `sha256`, the blob id)."""

    sha256: str
    """Of `data`: the agent verifies it on upload."""
    data: bytes = field(repr=False)
    file_count: int
    size: int
    """Uncompressed bytes of the files."""
    content_sha256: str
    """The content digest `code_fingerprint` gives (independent of compression)."""

    def fingerprint(self) -> dict[str, Any]:
        """The same dict `code_fingerprint` returns for this content."""
        return {"sha256": self.content_sha256, "files": self.file_count}


def pack(
    spec: RunSpec,
    base_dir: Path,
    run: str | None = None,
    limit: int = DEFAULT_LIMIT,
    private: PrivatePaths | None = None,
) -> CodeArchive | None:
    """The archive of `spec`'s local files and repos (relative local paths are relative to
    `base_dir`, the config file's directory), or None when it has none. Nothing of `private`
    (the project's `.dstack/` and state: `code_sources.private_paths`) nor any `.dstack/` is
    sent.

    Raises CodeError naming the run for a missing path, a bad target, a private path listed,
    a symlink out of a sent directory, or more than `limit` bytes (naming the biggest files).
    """
    entries = _entries(spec, base_dir, run, limit, private)
    if entries is None:
        return None
    digest = hashlib.sha256()
    size = 0
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for entry in entries:
                info = tarfile.TarInfo(entry.arcname)
                info.mode = entry.mode
                info.mtime = 0
                if entry.link is not None:
                    info.type = tarfile.SYMTYPE
                    info.linkname = entry.link
                    tar.addfile(info)
                    _add_digest(digest, entry, entry.link)
                    continue
                data = _read(entry)
                info.size = len(data)
                size += len(data)
                tar.addfile(info, io.BytesIO(data))
                _add_digest(digest, entry, hashlib.sha256(data).hexdigest())
    data = buffer.getvalue()
    return CodeArchive(
        sha256=hashlib.sha256(data).hexdigest(),
        data=data,
        file_count=len(entries),
        size=size,
        content_sha256=digest.hexdigest(),
    )


def code_fingerprint(
    spec: RunSpec,
    base_dir: Path,
    run: str | None = None,
    limit: int = DEFAULT_LIMIT,
    private: PrivatePaths | None = None,
) -> dict[str, Any] | None:
    """`{"sha256": content digest, "files": count}` of what `pack` would send, or None when
    the run sends no local files; raises what `pack` raises."""
    entries = _entries(spec, base_dir, run, limit, private)
    if entries is None:
        return None
    digest = hashlib.sha256()
    for entry in entries:
        _add_digest(digest, entry, entry.link if entry.link is not None else _file_hash(entry))
    return {"sha256": digest.hexdigest(), "files": len(entries)}


def _entries(
    spec: RunSpec, base_dir: Path, run: str | None, limit: int, private: PrivatePaths | None
) -> list[Entry] | None:
    if not local_sources(spec):
        return None
    label = run or spec.name or "run"
    entries = collect(spec, Path(base_dir), label, private)
    total = sum(e.size for e in entries)
    if total > limit:
        biggest = sorted(entries, key=lambda e: -e.size)[:_BIGGEST_SHOWN]
        shown = ", ".join(f"{e.source} ({_mb(e.size)})" for e in biggest)
        raise CodeError(
            f"{label}: files and repos add up to {_mb(total)}, over the {_mb(limit)} limit; "
            f"the biggest: {shown}. List what the job does not need in a .dstackignore "
            "(or .gitignore), or put data on a volume"
        )
    return entries


def _mb(size: int) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _add_digest(digest: Any, entry: Entry, content: str) -> None:
    kind = "link" if entry.link is not None else "file"
    digest.update(f"{entry.arcname}\0{entry.mode:o}\0{kind}\0{content}\n".encode())


def _read(entry: Entry) -> bytes:
    """The file's content; its hash goes to the cache when the file held still meanwhile."""
    try:
        with open(entry.source, "rb") as f:
            before = os.fstat(f.fileno())
            data = f.read()
            after = os.fstat(f.fileno())
    except OSError as e:
        raise CodeError(f"cannot read {entry.source}: {e.strerror}") from None
    if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns):
        key = (str(entry.source), after.st_size, after.st_mtime_ns)
        _hash_cache[key] = hashlib.sha256(data).hexdigest()
    return data


def _file_hash(entry: Entry) -> str:
    key = (str(entry.source), entry.size, entry.mtime_ns)
    cached = _hash_cache.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    try:
        with open(entry.source, "rb") as f:
            while chunk := f.read(_READ_SIZE):
                digest.update(chunk)
    except OSError as e:
        raise CodeError(f"cannot read {entry.source}: {e.strerror}") from None
    _hash_cache[key] = digest.hexdigest()
    return _hash_cache[key]


__all__ = [
    "DEFAULT_LIMIT",
    "CodeArchive",
    "CodeError",
    "PrivatePaths",
    "code_fingerprint",
    "pack",
    "private_paths",
]
