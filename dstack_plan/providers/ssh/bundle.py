"""The agent bundle SSH hosts get, built once per set of sources into a cache dir.

    bundle = cached_bundle()        # AgentBundle(path, sha256): a build of today's sources

A build takes a fraction of a second, and every command on an SSH fleet needs the bundle's
sha256 (it tells whether a host has this build). So builds are kept in
`$DSTACK_PLAN_CACHE_DIR` (default `$XDG_CACHE_HOME/dstack-plan`, i.e. `~/.cache/dstack-plan`),
under `agent/`, named by a hash of everything the build packs (`build.inputs_key`): the same
sources give the same bundle, with no build; a changed source, a new docker SDK or another
python gives a new one. The few newest builds are kept. Where the cache dir cannot be written,
the bundle is built into a temporary dir each time, as before there was a cache.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dstack_plan.agent.build import AGENT_DIR, gather, inputs_key, write_zipapp

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "DSTACK_PLAN_CACHE_DIR"
KEEP = 4
"""Builds kept in the cache (the newest ones; older ones are removed by the next build)."""


@dataclass(frozen=True)
class AgentBundle:
    """The agent zipapp to install, and its sha256 (what says two builds are the same)."""

    path: Path
    sha256: str

    @classmethod
    def of(cls, path: Path) -> AgentBundle:
        """The bundle at `path` (already built)."""
        return cls(path, _sha256(path))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_bundle(out: Path, *, include_docker: bool = True) -> AgentBundle:
    """Build the agent zipapp at `out` (no cache). Reproducible: the same sources give the
    same bytes, so a host that has this build is recognised and not uploaded to."""
    write_zipapp(gather(include_docker=include_docker), out)
    return AgentBundle.of(out)


def cache_dir() -> Path:
    """`$DSTACK_PLAN_CACHE_DIR`, else `$XDG_CACHE_HOME/dstack-plan` (`~/.cache/dstack-plan`)."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dstack-plan"


def cached_bundle(
    *, include_docker: bool = True, cache: Path | None = None, agent_dir: Path = AGENT_DIR
) -> AgentBundle:
    """The bundle of the current sources from the cache (see module doc), built there first
    when it is not yet; `agent_dir`: the agent package's sources (another copy, in tests).
    Blocking: call it in a thread from async code."""
    inputs = gather(include_docker=include_docker, agent_dir=agent_dir)
    directory = (cache or cache_dir()) / "agent"
    path = directory / f"agent-{inputs_key(inputs)[:40]}.pyz"
    sha_file = path.with_name(f"{path.name}.sha256")
    try:
        recorded = sha_file.read_text().strip()
        # a truncated or edited file is built again, never sent to a host
        if _sha256(path) == recorded:
            return AgentBundle(path, recorded)
    except OSError:
        pass
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".{path.name}.{os.getpid()}.tmp"
        try:
            write_zipapp(inputs, partial)
            sha256 = _sha256(partial)
            sha_partial = partial.with_name(f"{partial.name}.sha256")
            sha_partial.write_text(sha256 + "\n")
            # the bundle first: a reader who finds the sha file finds the bundle it describes
            os.replace(partial, path)
            os.replace(sha_partial, sha_file)
        finally:
            partial.unlink(missing_ok=True)
            partial.with_name(f"{partial.name}.sha256").unlink(missing_ok=True)
    except OSError as e:
        log.warning("cannot cache the agent bundle in %s (%s): building it anew", directory, e)
        return _uncached(include_docker)
    _prune(directory, keep=path)
    log.info("built the agent bundle %s", path)
    return AgentBundle(path, sha256)


def _prune(directory: Path, keep: Path) -> None:
    """Remove all but the KEEP newest builds (never `keep`, the one just made)."""
    try:  # another command may be pruning at the same time: what it removed is gone
        builds = sorted(
            (p for p in directory.glob("agent-*.pyz") if p != keep),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in builds[KEEP - 1 :]:
            old.with_name(f"{old.name}.sha256").unlink(missing_ok=True)
            old.unlink(missing_ok=True)
    except OSError as e:
        log.debug("pruning %s: %s", directory, e)


def _uncached(include_docker: bool) -> AgentBundle:
    """A build in a temporary dir removed when this process exits."""
    tmp = tempfile.mkdtemp(prefix="dstack-plan-agent-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    return build_bundle(Path(tmp) / "agent.pyz", include_docker=include_docker)
