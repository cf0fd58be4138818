"""A local git repo in `repos:` sends what git would commit now (real git)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from dstack_plan.config.runs import TaskSpec
from dstack_plan.runs.code_archive import code_fingerprint, pack

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def contents(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}  # type: ignore[union-attr]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    for name, text in {
        ".gitignore": "*.log\nout/\n",
        "train.py": "v1\n",
        "gone.py": "deleted later\n",
        "lib/util.py": "u\n",
        "tracked.log": "force-added\n",
    }.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(root, "add", ".gitignore", "train.py", "gone.py", "lib/util.py")
    git(root, "add", "-f", "tracked.log")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_tracked_plus_uncommitted_plus_untracked_not_ignored(repo: Path) -> None:
    (repo / "train.py").write_text("v2, not committed\n")
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("untracked\n")
    (repo / "debug.log").write_text("ignored\n")
    (repo / "out").mkdir()
    (repo / "out" / "model.bin").write_text("ignored dir\n")
    (repo / ".dstackignore").write_text("lib/\n")
    spec = TaskSpec.model_validate(
        {"type": "task", "name": "train", "commands": ["ls"], "repos": [str(repo)]}
    )
    archive = pack(spec, repo.parent)
    assert archive is not None
    assert contents(archive.data) == {
        "wd/.dstackignore": b"lib/\n",
        "wd/.gitignore": b"*.log\nout/\n",
        "wd/new.py": b"untracked\n",
        "wd/tracked.log": b"force-added\n",
        "wd/train.py": b"v2, not committed\n",
    }
    assert code_fingerprint(spec, repo.parent) == archive.fingerprint()


def test_an_uncommitted_edit_changes_the_fingerprint(repo: Path) -> None:
    spec = TaskSpec.model_validate(
        {"type": "task", "name": "train", "commands": ["ls"], "repos": ["repo:/src"]}
    )
    before = code_fingerprint(spec, repo.parent)
    (repo / "lib" / "util.py").write_text("edited\n")
    after = code_fingerprint(spec, repo.parent)
    assert before is not None and after is not None and before != after
    (repo / "debug.log").write_text("ignored: no change\n")
    assert code_fingerprint(spec, repo.parent) == after
