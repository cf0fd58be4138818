"""Uploaded code archives: a store named by sha256, and unpacking that cannot escape.

An archive (built by the controller's `runs/code_archive.py`) holds `wd/<path>` (relative to
the job's working dir), `home/<path>` (the job user's home) and `abs/<path>` (absolute).
Every member is checked before anything is written: no absolute names, no `..`, only
regular files, directories and symlinks that stay inside their root (no hard links, no
devices or fifos). Where this Python has tarfile's `data` filter it checks each member too.

A file keeps the owner-only mode it was packed with (0600, 0700: private on the user's
machine); any other is written 0644 or 0755.

A blob is shared by every job that names it (jobs of other projects too, when the content is
the same): it is removed with the last of them (`BlobStore.remove`, from the job manager's
delete, so a destroyed project leaves no copy of its files on the host). A submit that comes
after that finds no blob and is answered `missing_code`: the controller uploads it again.

Standard library only: the agent runs on a bare host with python3 >= 3.9.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

WD, HOME, ABS = "wd", "home", "abs"
ROOTS = (WD, HOME, ABS)
MAX_UNPACKED_BYTES = 4 * 1024 * 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1024 * 1024


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class BlobError(Exception):
    """An upload refused: HTTP status, message and error code for the API's answer."""

    def __init__(self, status: int, message: str, code: str):
        self.status = status
        self.code = code
        super().__init__(message)


class UnpackError(Exception):
    """The archive holds a member that may not be written (or cannot be read)."""


def valid_sha256(value: str) -> bool:
    """Whether `value` is a lower-case hex sha256."""
    return bool(_SHA256.fullmatch(value))


class BlobStore:
    """Archives under `root`, each file named by the sha256 of its bytes (created 0700)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, sha256: str) -> Path:
        """Where the blob `sha256` is (or would be) stored."""
        if not valid_sha256(sha256):
            raise BlobError(400, f"not a sha256: {sha256[:80]!r}", "invalid_sha256")
        return self.root / sha256

    def has(self, sha256: str) -> bool:
        """Whether the blob is stored."""
        return self.path(sha256).is_file()

    def put(self, sha256: str, body: Readable, length: int) -> bool:
        """Store `length` bytes read from `body` as `sha256`; False when it was already there.

        The bytes go to a temporary file while they are hashed, and become the blob only when
        the hash matches: a mismatch or a short body is a BlobError (400) and stores nothing.
        """
        target = self.path(sha256)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-")
        try:
            digest = hashlib.sha256()
            received = 0
            with os.fdopen(fd, "wb") as out:
                while received < length:
                    chunk = body.read(min(_CHUNK, length - received))
                    if not chunk:
                        break
                    digest.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if received < length:
                raise BlobError(
                    400, f"the body ended after {received} of {length} bytes", "short_body"
                )
            if digest.hexdigest() != sha256:
                raise BlobError(
                    400,
                    f"the body's sha256 is {digest.hexdigest()}, not {sha256}: "
                    "the upload was corrupted or named wrongly",
                    "sha256_mismatch",
                )
            existed = target.is_file()
            os.replace(tmp, target)
            return not existed
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def remove(self, sha256: str) -> bool:
        """Delete the blob (its last job is gone); False when it was not there."""
        try:
            self.path(sha256).unlink()
        except FileNotFoundError:
            return False
        return True


@dataclass(frozen=True)
class Member:
    """A checked archive member: which root it goes under, and its path below that root."""

    root: str
    path: str
    info: tarfile.TarInfo


def check_members(tar: tarfile.TarFile) -> list[Member]:
    """Every member of `tar`, checked; UnpackError names the first that may not be written."""
    checked: list[Member] = []
    total = 0
    for info in tar.getmembers():
        member = _check(info)
        if member is None:
            continue
        total += info.size
        if total > MAX_UNPACKED_BYTES:
            raise UnpackError(f"the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")
        checked.append(member)
    return checked


def _check(info: tarfile.TarInfo) -> Member | None:
    name = info.name
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise UnpackError(f"{name!r}: absolute or malformed member name")
    if ".." in parts:
        raise UnpackError(f"{name!r}: a member name with '..'")
    if parts[0] not in ROOTS:
        raise UnpackError(f"{name!r}: members must be under {', '.join(r + '/' for r in ROOTS)}")
    relative = "/".join(p for p in parts[1:] if p not in ("", "."))
    if not (info.isreg() or info.isdir() or info.issym()):
        kind = "a hard link" if info.islnk() else "a device, fifo or other special file"
        raise UnpackError(f"{name!r}: {kind} is not allowed")
    if not relative:
        if info.isdir():
            return None  # the root itself
        raise UnpackError(f"{name!r}: a file cannot replace the {parts[0]} directory")
    if info.issym():
        link = info.linkname
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(relative), link))
        if link.startswith("/") or inside == ".." or inside.startswith("../"):
            raise UnpackError(f"{name!r}: a symlink to {link!r} leaves its directory")
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is not None:  # python >= 3.12 and recent 3.9-3.11 patch releases
        try:
            data_filter(info.replace(name=relative, deep=False), "/nonexistent-dstack-root")
        except tarfile.TarError as e:
            raise UnpackError(f"{name!r}: {e}") from None
    return Member(parts[0], relative, info)


def _mode(info: tarfile.TarInfo) -> int:
    """0o755 for a directory; for a file 0o755 or 0o644 by its executable bit, only the
    owner's part of that (0o700, 0o600) when the archive gives nothing to group and others."""
    if info.isdir():
        return 0o755
    mode = 0o755 if info.mode & 0o111 else 0o644
    return mode if info.mode & 0o044 else mode & 0o700


def unpack(archive: Path, roots: dict[str, Path], owner: tuple[int, int] | None = None) -> int:
    """Write the archive's members below `roots` (one dir per root name), owned by `owner`
    (uid, gid) when given; returns how many were written. Nothing is written if any member
    is refused; a write through a symlink that leaves its root is refused too."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = check_members(tar)
            for member in members:
                root = roots[member.root]
                _make_dirs(root, root, owner)
                _extract(tar, member, root, owner)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise UnpackError(f"{type(e).__name__}: {e}") from None
    return len(members)


def _make_dirs(path: Path, root: Path, owner: tuple[int, int] | None) -> None:
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        if path == path.parent:
            break
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o755)
        if owner is not None and _inside(directory, root):
            os.lchown(directory, *owner)


def _inside(path: Path, root: Path) -> bool:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def _extract(
    tar: tarfile.TarFile, member: Member, root: Path, owner: tuple[int, int] | None
) -> None:
    dest = root / member.path
    _make_dirs(dest.parent, root, owner)
    if not _inside(dest.parent, root):
        raise UnpackError(f"{member.info.name!r}: its directory leads outside {root}")
    info = member.info
    if info.isdir():
        if not dest.is_dir():
            _make_dirs(dest, root, owner)
        return
    if os.path.islink(dest) or (os.path.lexists(dest) and not dest.is_dir()):
        dest.unlink()  # replaced, never written through
    if info.issym():
        os.symlink(info.linkname, dest)
    else:
        source = tar.extractfile(info)
        if source is None:
            raise UnpackError(f"{info.name!r}: cannot read the member")
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := source.read(_CHUNK):
                    out.write(chunk)
            os.chmod(tmp, _mode(info))
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if owner is not None:
        os.lchown(dest, *owner)


def repack(archive: Path, roots: dict[str, str], uid: int = 0, gid: int = 0) -> bytes:
    """The archive as an uncompressed tar to extract at `/` (docker's `put_archive`): each
    member renamed to its root's absolute path (`roots`: root name -> absolute POSIX path),
    owned by uid:gid, timestamped now. Refuses what `unpack` refuses."""
    out = io.BytesIO()
    now = int(time.time())
    try:
        with (
            tarfile.open(archive, "r:gz") as tar,
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as packed,
        ):
            for member in check_members(tar):
                full = posixpath.normpath(posixpath.join(roots[member.root], member.path))
                info = tarfile.TarInfo(full.lstrip("/"))
                info.type = member.info.type
                info.mode = 0o777 if member.info.issym() else _mode(member.info)
                info.linkname = member.info.linkname
                info.uid, info.gid, info.mtime = uid, gid, now
                if member.info.isreg():
                    info.size = member.info.size
                    packed.addfile(info, tar.extractfile(member.info))
                else:
                    packed.addfile(info)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise UnpackError(f"{type(e).__name__}: {e}") from None
    return out.getvalue()
