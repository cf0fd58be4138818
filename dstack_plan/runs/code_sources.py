"""What a run's `files:` and local `repos:` send: the local files, each with its target.

Targets are archive names the agent can place without guessing (see `code_archive`):
`wd/<path>` relative to the job's working dir, `home/<path>` relative to the job user's home
(`~/...`), `abs/<path>` for an absolute path. A `repos:` directory in a git work tree sends
what git would commit now (tracked files with their uncommitted changes, plus untracked
files that are not ignored); any other directory sends every file its own `.gitignore`
files leave in. `.dstackignore` files exclude more in both cases.

Never sent, whatever the ignore files say: a `.dstack/` directory (a project's state, secrets
and tokens) and the directory of a local state file kept elsewhere (`PrivatePaths`). A
symlink in a sent directory whose target lies outside that directory is a CodeError naming it
(listing the link itself in `files:` sends the file it points at). A file that is not group-
or world-readable here is sent with mode 0600 (0700 when executable), any other 0644 or 0755.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import stat
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import DstackPlanError

if TYPE_CHECKING:
    import pathspec

log = logging.getLogger(__name__)

WD, HOME, ABS = "wd", "home", "abs"
"""The archive's top-level directories: working dir, home, filesystem root."""
GITIGNORE, DSTACKIGNORE = ".gitignore", ".dstackignore"
PRIVATE_DIR = ".dstack"
"""A project's own directory (state, secrets, tokens): never sent, at any depth of a tree."""
_GIT_TIMEOUT = 60.0


class CodeError(DstackPlanError):
    """A run's `files:` or `repos:` cannot be packed (missing path, bad target, too big)."""


@dataclass(frozen=True)
class Entry:
    """One member of the archive: a local file (or a symlink kept as one) and its target."""

    arcname: str
    source: Path
    """The file whose content is sent (a symlink's own path when `link` is set)."""
    mode: int
    """0o644 or 0o755, or 0o600 / 0o700 for a file private here (see `file_mode`)."""
    size: int
    mtime_ns: int
    link: str | None = None
    """A relative symlink that stays inside its tree is sent as a symlink with this target."""


@dataclass(frozen=True)
class PrivatePaths:
    """What a project keeps for itself and never sends, by real (symlink-free) path."""

    dirs: tuple[str, ...] = ()
    """Directories never sent, nor anything below them: the project's `.dstack/`, the
    directory of a local state file."""
    beside: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...] = ()
    """`(directory, name prefixes, names)`: the state file and its companions (backup, locks,
    history, records) where the state lives in a directory that is sent otherwise."""

    def covers(self, real: str) -> bool:
        """Whether the file or directory at real path `real` is private."""
        for directory in self.dirs:
            if _within(real, directory):
                return True
        for directory, prefixes, names in self.beside:
            if real.startswith(directory.rstrip("/") + "/"):
                first = real[len(directory.rstrip("/")) + 1 :].split("/")[0]
                if first in names or first.startswith(prefixes):
                    return True
        return False

    def inside(self, real_root: str) -> bool:
        """Whether anything private may lie below the directory `real_root`."""
        places = [*self.dirs, *(d for d, _, _ in self.beside)]
        return any(_within(place, real_root) or _within(real_root, place) for place in places)


def private_paths(project_dir: Path, state_file: Path | None = None) -> PrivatePaths:
    """The project's private places: its `.dstack/`, and for a local state file its
    directory, or, when that directory is the project's own (or holds it), the state file
    and the files kept beside it."""
    from dstack_plan.state.events import EVENTS_RECORD  # noqa: PLC0415 - only with a state
    from dstack_plan.state.lease import LEASE_RECORD  # noqa: PLC0415
    from dstack_plan.state.local_records import record_path  # noqa: PLC0415

    project = os.path.realpath(project_dir)
    dirs = [os.path.join(project, PRIVATE_DIR)]
    beside: list[tuple[str, tuple[str, ...], frozenset[str]]] = []
    if state_file is not None:
        state = Path(os.path.realpath(state_file))
        directory = str(state.parent)
        if _within(project, directory):  # the project dir itself, or one that holds it
            records = [record_path(state, name).name for name in (EVENTS_RECORD, LEASE_RECORD)]
            names = frozenset(records + [f"{name}.lock" for name in records])
            beside.append((directory, (state.name, f".{state.name}"), names))
        elif not any(_within(directory, d) for d in dirs):
            dirs.append(directory)
    return PrivatePaths(tuple(dirs), tuple(beside))


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def local_sources(spec: RunSpec) -> list[tuple[str, str, str]]:
    """`(what, local_path, target)` of each `files:` entry and local `repos:` entry."""
    sources = [("files", f.local_path, f.path) for f in spec.files]
    sources += [("repos", r.local_path, r.path) for r in spec.repos if r.local_path]
    return sources


def collect(
    spec: RunSpec, base_dir: Path, run: str, private: PrivatePaths | None = None
) -> list[Entry]:
    """Every file the run sends, sorted by archive name; a later entry wins a shared target.

    Raises CodeError naming the run for a missing local path, a target outside the working
    dir, a file and a directory wanting the same target, a private path listed (`private`,
    or any `.dstack/`), or a symlink out of a sent directory.
    """
    private = private or PrivatePaths()
    chosen: dict[str, Entry] = {}
    for what, local, target in local_sources(spec):
        path = Path(os.path.expanduser(local))
        if not path.is_absolute():
            path = base_dir / path
        try:
            info = path.stat()
        except FileNotFoundError:
            raise CodeError(
                f"{run}: {what}: local path {local!r} does not exist (looked for {path})"
            ) from None
        except OSError as e:
            raise CodeError(f"{run}: {what}: cannot read {local!r}: {e.strerror}") from None
        if PRIVATE_DIR in Path(local).parts or private.covers(os.path.realpath(path)):
            raise CodeError(
                f"{run}: {what}: {local!r} is in the project's private directory "
                f"({PRIVATE_DIR}/ or the state's): its state, secrets and tokens are never sent"
            )
        prefix = target_name(target, run, what)
        if stat.S_ISDIR(info.st_mode):
            shown = f"{run}: {what}: {local!r}"
            for entry in tree_entries(path, prefix, what == "repos", private, shown):
                chosen[entry.arcname] = entry
        else:
            if target.endswith("/"):
                prefix = f"{prefix}/{path.name}"
            if prefix in (WD, HOME, ABS):
                raise CodeError(
                    f"{run}: {what}: {local!r} is a file; its target {target!r} names a "
                    "directory (give a file path)"
                )
            chosen[prefix] = _file_entry(prefix, path, info)
    _check_overlaps(chosen, run)
    return [chosen[name] for name in sorted(chosen)]


def target_name(target: str, run: str, what: str) -> str:
    """The archive name for a target path: `wd/...`, `home/...` or `abs/...` (normalised)."""
    if target.startswith("/"):
        top, rest = ABS, target
    elif target == "~" or target.startswith("~/"):
        top, rest = HOME, target[1:]
    else:
        top, rest = WD, target
    normal = posixpath.normpath("/" + rest) if top == ABS else posixpath.normpath(rest)
    if normal == ".." or normal.startswith("../"):
        raise CodeError(
            f"{run}: {what}: target {target!r} leaves the "
            f"{'home' if top == HOME else 'working'} directory"
        )
    normal = normal.strip("/")
    return top if normal in ("", ".") else f"{top}/{normal}"


def _check_overlaps(chosen: dict[str, Entry], run: str) -> None:
    for name in chosen:
        parent = posixpath.dirname(name)
        while parent not in ("", WD, HOME, ABS):
            if parent in chosen:
                raise CodeError(
                    f"{run}: files: {_shown(parent)} is both a file and a directory "
                    f"holding {_shown(name)}"
                )
            parent = posixpath.dirname(parent)


def _shown(arcname: str) -> str:
    top, _, rest = arcname.partition("/")
    return {WD: rest, HOME: f"~/{rest}", ABS: f"/{rest}"}[top]


def file_mode(st_mode: int) -> int:
    """The mode a file is sent with: 0o755 when executable here, else 0o644; only the
    owner's bits (0o700 / 0o600) when neither group nor others may read it here."""
    mode = 0o755 if st_mode & 0o111 else 0o644
    return mode if st_mode & 0o044 else mode & 0o700


def _file_entry(arcname: str, path: Path, info: os.stat_result) -> Entry:
    return Entry(arcname, path, file_mode(info.st_mode), info.st_size, info.st_mtime_ns)


# -- a directory ------------------------------------------------------------------------------


def tree_entries(
    root: Path,
    prefix: str,
    use_git: bool,
    private: PrivatePaths | None = None,
    shown: str = "",
) -> Iterator[Entry]:
    """The entries for directory `root` placed under `prefix` (see `tree_files`), without
    what is private; CodeError (starting with `shown`) for a symlink to a file outside."""
    private = private or PrivatePaths()
    real_root = os.path.realpath(root)
    check_each = private.inside(real_root)
    for relative in tree_files(root, use_git):
        if check_each and private.covers(posixpath.join(real_root, relative)):
            continue
        path = root / relative
        try:
            info = path.lstat()
        except OSError:
            continue  # deleted since it was listed (a tracked file removed but not committed)
        arcname = f"{prefix}/{relative}"
        if stat.S_ISLNK(info.st_mode):
            entry = _link_entry(arcname, path, relative, info, real_root, private, shown)
            if entry is not None:
                yield entry
        elif stat.S_ISREG(info.st_mode):
            yield _file_entry(arcname, path, info)


def _link_entry(
    arcname: str,
    path: Path,
    relative: str,
    info: os.stat_result,
    real_root: str,
    private: PrivatePaths,
    shown: str,
) -> Entry | None:
    """A relative symlink inside the tree stays one; an absolute one (or one that climbs out
    and back) to a file of the tree is sent as that file. A symlink to a file outside the
    tree, or to a private file, is a CodeError: packing a directory must never pick up a
    file from elsewhere on this machine (`creds -> ~/.aws/credentials`)."""
    target = os.readlink(path)
    inside = posixpath.normpath(posixpath.join(posixpath.dirname(relative), target))
    if not target.startswith("/") and inside != ".." and not inside.startswith("../"):
        return Entry(arcname, path, 0o777, 0, info.st_mtime_ns, link=target)
    try:
        pointed = path.stat()
    except OSError:
        log.warning("skipping %s: a dangling symlink to %s", path, target)
        return None
    if not stat.S_ISREG(pointed.st_mode):
        log.warning("skipping %s: a symlink to a directory outside the tree", path)
        return None
    real = os.path.realpath(path)
    if not _within(real, real_root) or private.covers(real):
        where = "a private file" if private.covers(real) else "outside the directory sent"
        raise CodeError(
            f"{shown}: {relative} is a symlink to {target!r} ({real}), {where}; it is not "
            "sent. Remove it or list it in a .dstackignore; to send the file it points at, "
            "list the link itself in files:"
        )
    return _file_entry(arcname, path, pointed)


def tree_files(root: Path, use_git: bool) -> list[str]:
    """Relative POSIX paths of the files (and symlinks) to send from `root`: with `use_git`
    and in a git work tree, git's list, else the walk honouring `root`'s ignore files."""
    listed = _git_files(root) if use_git else None
    if listed is None:
        return _walk(root)
    listed = [p for p in listed if PRIVATE_DIR not in p.split("/")]
    rules = IgnoreRules()
    for relative in [".dstackignore", *listed]:
        if posixpath.basename(relative) == DSTACKIGNORE:
            rules.read(root, posixpath.dirname(relative), (DSTACKIGNORE,))
    return sorted({p for p in listed if not rules.ignored(p)})


def _git_files(root: Path) -> list[str] | None:
    """What git would commit from `root` now, or None when it is no git work tree."""
    git = shutil.which("git")
    if git is None:
        if any((d / ".git").exists() for d in (root, *root.parents)):
            log.warning("git is not installed: packing %s by its .gitignore files", root)
        return None
    try:
        done = subprocess.run(
            [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            timeout=_GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("git ls-files failed in %s (%s): packing by .gitignore files", root, e)
        return None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        if "not a git repository" not in message:
            log.warning("git ls-files failed in %s (%s): packing by .gitignore", root, message)
        return None
    names = [os.fsdecode(n) for n in done.stdout.split(b"\0") if n]
    # a submodule or a nested repo is listed as a directory: send its files too
    files: list[str] = []
    for name in dict.fromkeys(n.rstrip("/") for n in names):
        if (root / name).is_dir() and not (root / name).is_symlink():
            files += [f"{name}/{p}" for p in _walk(root / name)]
        else:
            files.append(name)
    return files


def _walk(root: Path) -> list[str]:
    """Every file under `root` that its `.gitignore` and `.dstackignore` files leave in
    (never `.git/` nor `.dstack/`)."""
    rules = IgnoreRules()
    found: list[str] = []
    for directory, dirnames, filenames in os.walk(root):
        relative_dir = Path(directory).relative_to(root).as_posix()
        relative_dir = "" if relative_dir == "." else relative_dir
        rules.read(root, relative_dir, (GITIGNORE, DSTACKIGNORE))
        kept_dirs = []
        for name in sorted(dirnames):
            relative = posixpath.join(relative_dir, name)
            if name in (".git", PRIVATE_DIR) or rules.ignored(relative, is_dir=True):
                continue
            if os.path.islink(os.path.join(directory, name)):
                found.append(relative)  # a symlink: sent as a link, never followed
            else:
                kept_dirs.append(name)
        dirnames[:] = kept_dirs
        for name in filenames:
            relative = posixpath.join(relative_dir, name)
            if not rules.ignored(relative):
                found.append(relative)
    return sorted(found)


class IgnoreRules:
    """gitignore-style patterns from ignore files at several levels of one tree; a deeper
    file's patterns win over a higher one's, and an ignored directory hides all it holds."""

    def __init__(self) -> None:
        self._specs: dict[str, pathspec.GitIgnoreSpec] = {}
        self._dirs: dict[str, bool] = {}

    def read(self, root: Path, relative_dir: str, names: Iterable[str]) -> None:
        """Add the patterns of the ignore files `names` in `relative_dir` ("" is the root)."""
        lines: list[str] = []
        for name in names:
            try:
                lines += (root / relative_dir / name).read_text(errors="replace").splitlines()
            except OSError:
                continue
        if lines:
            import pathspec  # noqa: PLC0415 - only when a tree has ignore files

            self._specs[relative_dir] = pathspec.GitIgnoreSpec.from_lines(lines)
            self._dirs.clear()

    def ignored(self, relative: str, is_dir: bool = False) -> bool:
        """Whether `relative` (a POSIX path from the root) is excluded."""
        if not self._specs:
            return False
        parent = posixpath.dirname(relative)
        if parent and self._dir_ignored(parent):
            return True
        return self._decide(relative, is_dir)

    def _dir_ignored(self, relative: str) -> bool:
        known = self._dirs.get(relative)
        if known is None:
            parent = posixpath.dirname(relative)
            known = bool(parent and self._dir_ignored(parent)) or self._decide(relative, True)
            self._dirs[relative] = known
        return known

    def _decide(self, relative: str, is_dir: bool) -> bool:
        level = posixpath.dirname(relative)
        while True:
            spec = self._specs.get(level)
            if spec is not None:
                below = relative[len(level) + 1 :] if level else relative
                result = spec.check_file(below + "/" if is_dir else below)
                if result.include is not None:
                    return bool(result.include)
            if not level:
                return False
            level = posixpath.dirname(level)
