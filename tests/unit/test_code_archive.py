"""Packing a run's local `files:` and `repos:`: deterministic, ignore-aware, clear errors."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.config.runs import TaskSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.code_archive import CodeError, code_fingerprint, pack


def task(**fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"type": "task", "name": "train", "commands": ["ls"], **fields})


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def contents(data: bytes) -> dict[str, bytes | str]:
    """Each member's content, or `-> target` for a symlink."""
    out: dict[str, bytes | str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar.getmembers():
            if m.issym():
                out[m.name] = f"-> {m.linkname}"
            else:
                handle = tar.extractfile(m)
                assert handle is not None
                out[m.name] = handle.read()
    return out


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_nothing_local_packs_to_none(tmp_path: Path) -> None:
    spec = task(repos=["https://github.com/org/repo.git"])
    assert pack(spec, tmp_path) is None
    assert code_fingerprint(spec, tmp_path) is None


def test_same_content_same_hash_changed_byte_other_hash_mtime_alone_same(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {"a.py": "print(1)\n", "pkg/b.py": "x = 2\n"})
    spec = task(files=["src:code"])
    first = pack(spec, tmp_path)
    assert first is not None
    fingerprint = code_fingerprint(spec, tmp_path)
    assert fingerprint == first.fingerprint() == {"sha256": first.content_sha256, "files": 2}

    os.utime(tmp_path / "src" / "a.py", (1_000_000, 1_000_000))
    touched = pack(spec, tmp_path)
    assert touched is not None
    assert (touched.sha256, touched.data) == (first.sha256, first.data)
    assert code_fingerprint(spec, tmp_path) == fingerprint

    (tmp_path / "src" / "a.py").write_text("print(2)\n")
    changed = pack(spec, tmp_path)
    assert changed is not None
    assert changed.sha256 != first.sha256
    assert changed.content_sha256 != first.content_sha256
    assert code_fingerprint(spec, tmp_path) == changed.fingerprint() != fingerprint


def test_members_are_normalised(tmp_path: Path) -> None:
    make_tree(tmp_path, {"run.sh": "#!/bin/sh\n", "data.txt": "d", "shared.txt": "s"})
    (tmp_path / "run.sh").chmod(0o775)
    (tmp_path / "data.txt").chmod(0o600)  # private here: stays private (see test_code_private)
    (tmp_path / "shared.txt").chmod(0o640)
    archive = pack(task(files=["run.sh", "data.txt", "shared.txt"]), tmp_path)
    assert archive is not None
    found = members(archive.data)
    assert list(found) == ["wd/data.txt", "wd/run.sh", "wd/shared.txt"]  # sorted
    assert {m.name: oct(m.mode) for m in found.values()} == {
        "wd/data.txt": "0o600",
        "wd/run.sh": "0o755",
        "wd/shared.txt": "0o644",
    }
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in found.values()} == {
        (0, 0, 0, "", "")
    }


def test_targets_relative_home_and_absolute(tmp_path: Path) -> None:
    make_tree(tmp_path, {"cfg/a.yml": "a", "notes.txt": "n", "key": "k", "lib/m.py": "m"})
    spec = task(
        files=[
            "cfg:/etc/app",
            {"local_path": "notes.txt", "path": "docs/"},
            "key:~/.ssh/key",
            "lib/m.py",
        ]
    )
    archive = pack(spec, tmp_path)
    assert archive is not None
    assert contents(archive.data) == {
        "abs/etc/app/a.yml": b"a",
        "home/.ssh/key": b"k",
        "wd/docs/notes.txt": b"n",
        "wd/lib/m.py": b"m",
    }


def test_local_paths_are_relative_to_the_config_dir(tmp_path: Path) -> None:
    make_tree(tmp_path / "project", {"x.txt": "x"})
    archive = pack(task(files=["x.txt:y.txt"]), tmp_path / "project")
    assert archive is not None and contents(archive.data) == {"wd/y.txt": b"x"}


def test_a_repo_lands_at_its_path_default_the_working_dir(tmp_path: Path) -> None:
    make_tree(tmp_path / "repo", {"train.py": "t"})
    default = pack(task(repos=["repo"]), tmp_path)
    placed = pack(task(repos=[{"local_path": "repo", "path": "/workspace/repo"}]), tmp_path)
    assert default is not None and placed is not None
    assert contents(default.data) == {"wd/train.py": b"t"}
    assert contents(placed.data) == {"abs/workspace/repo/train.py": b"t"}


def test_gitignore_and_dstackignore_of_the_packed_directory(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            ".gitignore": "*.log\nbuild/\n!keep.log\n",
            ".dstackignore": "data/\n*.ckpt\n",
            "main.py": "m",
            "debug.log": "noise",
            "keep.log": "kept",
            "build/out.o": "o",
            "data/big.bin": "b",
            "model.ckpt": "c",
            "sub/.gitignore": "local.txt\n",
            "sub/local.txt": "l",
            "sub/other.txt": "o",
            "sub/deep/debug.log": "deep noise",
        },
    )
    (tmp_path / "src" / ".git").mkdir()
    (tmp_path / "src" / ".git" / "HEAD").write_text("ref")
    archive = pack(task(files=["src:app"]), tmp_path)
    assert archive is not None
    assert sorted(contents(archive.data)) == [
        "wd/app/.dstackignore",
        "wd/app/.gitignore",
        "wd/app/keep.log",
        "wd/app/main.py",
        "wd/app/sub/.gitignore",
        "wd/app/sub/other.txt",
    ]


def test_dstackignore_can_bring_back_what_gitignore_leaves_out(tmp_path: Path) -> None:
    make_tree(tmp_path / "d", {".gitignore": "*.env\n", ".dstackignore": "!prod.env\n"})
    make_tree(tmp_path / "d", {"dev.env": "1", "prod.env": "2"})
    archive = pack(task(files=["d:."]), tmp_path)
    assert archive is not None
    assert sorted(contents(archive.data)) == ["wd/.dstackignore", "wd/.gitignore", "wd/prod.env"]


def test_an_explicitly_listed_file_is_sent_even_if_ignored(tmp_path: Path) -> None:
    make_tree(tmp_path, {".gitignore": "*.env\n", "x.env": "secret-ish"})
    archive = pack(task(files=["x.env"]), tmp_path)
    assert archive is not None and contents(archive.data) == {"wd/x.env": b"secret-ish"}


def test_symlinks_inside_stay_links_outside_are_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"outside.txt": "out", "tree/real.txt": "r"})
    (tmp_path / "tree" / "inner").symlink_to("real.txt")
    (tmp_path / "tree" / "absolute").symlink_to(tmp_path / "tree" / "real.txt")
    (tmp_path / "tree" / "dangling").symlink_to("missing")  # inside, kept as it is
    archive = pack(task(files=["tree:t"]), tmp_path)
    assert archive is not None
    assert contents(archive.data) == {
        "wd/t/absolute": b"r",  # an absolute link into the tree: sent as the file
        "wd/t/dangling": "-> missing",
        "wd/t/inner": "-> real.txt",
        "wd/t/real.txt": b"r",
    }
    (tmp_path / "tree" / "outer").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(CodeError, match="outer is a symlink to .*outside.txt"):
        pack(task(files=["tree:t"]), tmp_path)


def test_missing_local_path_names_the_run_and_the_path(tmp_path: Path) -> None:
    with pytest.raises(DstackPlanError) as e:
        pack(task(files=["nope/data.csv:/data"]), tmp_path)
    assert isinstance(e.value, CodeError)
    assert "train" in str(e.value) and "'nope/data.csv'" in str(e.value)
    with pytest.raises(CodeError, match="task.train: repos: local path 'gone'"):
        code_fingerprint(task(repos=["gone"]), tmp_path, run="task.train")


def test_a_target_leaving_the_working_dir_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a": "a"})
    with pytest.raises(CodeError, match="leaves the working directory"):
        pack(task(files=["a:../a"]), tmp_path)


def test_a_file_and_a_directory_on_one_target_are_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a": "a", "d/x": "x"})
    with pytest.raises(CodeError, match="both a file and a directory"):
        pack(task(files=["a:out", "d:out"]), tmp_path)


def test_a_later_entry_wins_a_shared_target(tmp_path: Path) -> None:
    make_tree(tmp_path, {"one": "1", "two": "2"})
    archive = pack(task(files=["one:same", "two:same"]), tmp_path)
    assert archive is not None and contents(archive.data) == {"wd/same": b"2"}


def test_over_the_limit_names_the_biggest_files(tmp_path: Path) -> None:
    make_tree(tmp_path / "d", {"small.txt": "s" * 10, "big.bin": "b" * 5000, "mid": "m" * 900})
    with pytest.raises(CodeError) as e:
        pack(task(files=["d"]), tmp_path, limit=4096)
    message = str(e.value)
    assert "add up to 5.8 KB, over the 4.0 KB limit" in message
    assert message.index("big.bin") < message.index("mid") < message.index("small.txt")
    assert ".dstackignore" in message
    assert pack(task(files=["d"]), tmp_path, limit=10_000) is not None
