"""The local backend's earlier versions: `state.json.history/<serial>.json`, the last 20.

Each content-changing write hard-links the file it just wrote into the history directory, so
a version is kept by its inode: no copy, and a commit of a large state costs one `link` more.
The next write renames a new inode over `state.json`, leaving the linked one untouched.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from dstack_plan.config.atomic import temp_path_for
from dstack_plan.errors import StateError
from dstack_plan.state.backend import StateVersion
from dstack_plan.state.codec import parse_state
from dstack_plan.state.model import State

logger = logging.getLogger(__name__)

KEEP_VERSIONS = 20
_VERSION_FILE = re.compile(r"([0-9]+)\.json")
# Canonical state JSON sorts its keys, so the lineage comes within the first few bytes.
_LINEAGE = re.compile(rb'"lineage":\s*"([0-9a-f-]{36})"')
_HEAD_BYTES = 512


def history_dir(state_path: Path) -> Path:
    """`.dstack/state.json.history` beside `.dstack/state.json`."""
    return state_path.with_name(state_path.name + ".history")


def _serials(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = (_VERSION_FILE.fullmatch(name) for name in names)
    return sorted(int(m.group(1)) for m in found if m is not None)


def keep(state_path: Path, directory: Path, serial: int) -> None:
    """Link the state file just written (serial `serial`) into the history and prune it to
    the newest KEEP_VERSIONS. Failing to keep history never fails the write it follows."""
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        target = directory / f"{serial}.json"
        tmp = temp_path_for(target)
        os.link(state_path, tmp)
        try:
            os.replace(tmp, target)  # a leftover of a replaced lineage may hold the name
        finally:
            tmp.unlink(missing_ok=True)
        for old in _serials(directory)[:-KEEP_VERSIONS]:
            (directory / f"{old}.json").unlink(missing_ok=True)
    except OSError as err:  # no hard links here, or a full disk: the state itself is written
        logger.warning("%s: could not keep this version in the history: %s", directory, err)


def _lineage_of(path: Path) -> str:
    try:
        with path.open("rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return ""
    match = _LINEAGE.search(head)
    return match.group(1).decode() if match else ""


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    except OSError:
        return None


def versions(directory: Path, current: State | None, state_path: Path) -> list[StateVersion]:
    """The kept versions newest first, the current one marked (and listed even when it was
    written before history was kept)."""
    out = [
        StateVersion(
            id=str(serial),
            serial=serial,
            lineage=_lineage_of(directory / f"{serial}.json"),
            written_at=_mtime(directory / f"{serial}.json"),
        )
        for serial in reversed(_serials(directory))
    ]
    if current is None:
        return out
    marked = [
        v._replace(current=True)
        if v.serial == current.serial and v.lineage == current.lineage
        else v
        for v in out
    ]
    if not any(v.current for v in marked):
        own = StateVersion(
            id=str(current.serial),
            serial=current.serial,
            lineage=current.lineage,
            written_at=_mtime(state_path),
            current=True,
        )
        marked = [own, *(v for v in marked if v.serial != current.serial)]
    return marked


def read(directory: Path, version_id: str, location: str) -> State:
    """The state kept as version `version_id` (a serial); StateError when it is not kept."""
    if _VERSION_FILE.fullmatch(f"{version_id}.json") is None:
        raise StateError(f"{location}: no version {version_id!r}: a version is a serial number")
    path = directory / f"{int(version_id)}.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        kept = ", ".join(str(s) for s in reversed(_serials(directory))) or "none"
        raise StateError(f"{location}: version {version_id} is not kept (kept: {kept})") from None
    except OSError as err:
        raise StateError(f"{path}: cannot read: {err.strerror}") from None
    return parse_state(data, path)
