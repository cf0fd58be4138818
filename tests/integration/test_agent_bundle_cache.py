"""The agent bundle is built once per set of sources into the cache dir, and reused.

Builds run `python` to compile the `.pyc` files, so these are integration tests. Each uses
its own cache dir (`DSTACK_PLAN_CACHE_DIR`); a changed source is made in a copy of the agent
package (`agent_dir=`), never in the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dstack_plan.agent.build import AGENT_DIR
from dstack_plan.providers.ssh.bundle import (
    CACHE_DIR_ENV,
    KEEP,
    AgentBundle,
    build_bundle,
    cache_dir,
    cached_bundle,
)
from dstack_plan.providers.ssh.provider import SSHProvider


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def builds(cache: Path) -> list[Path]:
    return sorted((cache / "agent").glob("agent-*.pyz"))


def agent_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "agent-src"
    shutil.copytree(AGENT_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/cache")
    assert cache_dir() == Path("/somewhere/cache/dstack-plan")
    monkeypatch.setenv(CACHE_DIR_ENV, "/elsewhere")
    assert cache_dir() == Path("/elsewhere")


async def test_two_providers_share_one_build(cache: Path) -> None:
    first, second = SSHProvider(), SSHProvider()
    try:
        built = await first.bundle()
        stat = built.path.stat()
        assert builds(cache) == [built.path]
        again = await second.bundle()
        assert again == built
        after = again.path.stat()
        # the same file, not written again
        assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
        assert AgentBundle.of(again.path).sha256 == built.sha256
    finally:
        await first.close()
        await second.close()


def test_a_changed_source_gets_a_new_build_and_the_same_sources_none(
    cache: Path, tmp_path: Path
) -> None:
    original = cached_bundle()
    copy = agent_copy(tmp_path)
    # the same sources elsewhere: the same build (the key is the content, not the path)
    assert cached_bundle(agent_dir=copy) == original
    with open(copy / "protocol.py", "a") as f:
        f.write("\n# changed\n")
    changed = cached_bundle(agent_dir=copy)
    assert changed.path != original.path and changed.sha256 != original.sha256
    with zipfile.ZipFile(changed.path) as archive:
        assert archive.read("dstack_plan/agent/protocol.py").endswith(b"# changed\n")
    assert set(builds(cache)) == {original.path, changed.path}
    assert cached_bundle(agent_dir=copy) == changed  # and that one is kept too


def test_a_damaged_build_in_the_cache_is_built_again(cache: Path) -> None:
    original = cached_bundle()
    original.path.write_bytes(original.path.read_bytes()[:1000])
    again = cached_bundle()
    assert again == original and AgentBundle.of(again.path).sha256 == original.sha256


def test_an_unwritable_cache_dir_still_gives_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker))
    bundle = cached_bundle()
    assert bundle.path.exists() and not bundle.path.is_relative_to(blocker)
    assert bundle.sha256 == build_bundle(tmp_path / "plain.pyz").sha256


def test_only_the_newest_builds_are_kept(cache: Path) -> None:
    (cache / "agent").mkdir(parents=True)
    old = []
    for i in range(KEEP + 2):
        path = cache / "agent" / f"agent-old{i}.pyz"
        path.write_bytes(b"old")
        path.with_name(f"{path.name}.sha256").write_text("x\n")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        old.append(path)
    built = cached_bundle()
    kept = builds(cache)
    assert len(kept) == KEEP and built.path in kept
    assert set(kept) - {built.path} == set(old[-(KEEP - 1) :])  # the newest of the old ones
    assert not old[0].with_name(f"{old[0].name}.sha256").exists()


def test_builds_are_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    """The `.pyc` files depend on the sources only, not on what the building process has
    loaded (this one has pytest, pydantic, the docker SDK...)."""
    here = build_bundle(tmp_path / "here.pyz")
    script = (
        "import sys; from pathlib import Path; "
        "from dstack_plan.providers.ssh.bundle import build_bundle; "
        "print(build_bundle(Path(sys.argv[1])).sha256)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "there.pyz")],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert done.stdout.strip() == here.sha256


def test_every_module_is_also_in_compiled_for_this_python(tmp_path: Path) -> None:
    bundle = build_bundle(tmp_path / "agent.pyz")
    with zipfile.ZipFile(bundle.path) as archive:
        names = set(archive.namelist())
    sources = {n for n in names if n.endswith(".py") and n != "__main__.py"}
    assert "dstack_plan/agent/server.py" in sources and "docker/__init__.py" in sources
    assert {n for n in names if n.endswith(".pyc")} == {f"{n}c" for n in sources}
