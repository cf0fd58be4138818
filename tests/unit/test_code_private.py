"""What a run's `files:` / `repos:` never send: the project's `.dstack/` and its state, files
a symlink leads to outside the sent directory; and the modes private files keep."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.blobs import ABS, HOME, WD, repack, unpack
from dstack_plan.config.runs import TaskSpec
from dstack_plan.project import Project
from dstack_plan.runs.code_archive import CodeError, code_fingerprint, pack, private_paths

SECRET = "never-in-a-job-7f3a"


def task(**fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"type": "task", "name": "train", "commands": ["ls"], **fields})


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers())


def modes(data: bytes) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: oct(m.mode) for m in tar.getmembers()}


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def uninitialised_project(root: Path) -> Path:
    """A project where `dstack init` never ran: no .gitignore / .dstackignore keeps
    `.dstack/` out, and one even asks for it back."""
    return write(
        root,
        {
            "train.py": "print('train')\n",
            ".dstackignore": "!.dstack/\n!.dstack/*\n",
            ".dstack/secrets.yml": f"API_TOKEN: {SECRET}\n",
            ".dstack/state.json": "{}",
            ".dstack/ui-token": "ui",
            ".dstack/service-token": "svc",
            "sub/.dstack/state.json": "{}",  # a nested project's: private too
            "sub/run.dstack.yml": "type: task\n",
        },
    )


@pytest.mark.parametrize("what", ["files", "repos"])
def test_the_project_dstack_dir_is_never_packed(tmp_path: Path, what: str) -> None:
    root = uninitialised_project(tmp_path / "project")
    spec = task(**{what: ["."]})
    for private in (private_paths(root, root / ".dstack" / "state.json"), None):
        archive = pack(spec, root, private=private)
        assert archive is not None
        assert names(archive.data) == [
            "wd/.dstackignore",
            "wd/sub/run.dstack.yml",
            "wd/train.py",
        ]
        assert SECRET.encode() not in archive.data
        assert code_fingerprint(spec, root, private=private) == archive.fingerprint()


def test_a_config_in_a_subdirectory_reaching_the_project_root(tmp_path: Path) -> None:
    root = uninitialised_project(tmp_path / "project")
    (root / "sub" / ".dstack").rename(root / "sub" / "kept")
    archive = pack(task(files=["..:app"]), root / "sub", private=private_paths(root))
    assert archive is not None
    assert names(archive.data) == [
        "wd/app/.dstackignore",
        "wd/app/sub/kept/state.json",
        "wd/app/sub/run.dstack.yml",
        "wd/app/train.py",
    ]


def test_a_local_state_file_elsewhere_keeps_its_whole_directory(tmp_path: Path) -> None:
    root = write(tmp_path / "project", {"train.py": "t", "states/prod.json": "{}"})
    write(root / "states", {"prod.json.backup": "{}", "prod.events.jsonl": "", "notes": "n"})
    archive = pack(task(files=["."]), root, private=private_paths(root, root / "states/p.json"))
    assert archive is not None and names(archive.data) == ["wd/train.py"]
    with pytest.raises(CodeError, match="'states/notes' is in the project's private"):
        pack(task(files=["states/notes"]), root, private=private_paths(root, root / "states/x"))


def test_a_state_file_in_the_project_dir_itself_keeps_its_own_files(tmp_path: Path) -> None:
    root = write(
        tmp_path / "project",
        {
            "main.py": "m",
            "main.json": "{}",  # the state
            "main.json.backup": "{}",
            "main.json.lock": "",
            ".main.json.lock.info": "{}",
            "main.json.history/3.json": "{}",
            "main.events.jsonl": "",
            "main.watch-lease.json": "{}",
            "main.watch-lease.json.lock": "",
            "events.jsonl": "mine",  # the project's own file: records of main.json are main.*
        },
    )
    archive = pack(task(files=["."]), root, private=private_paths(root, root / "main.json"))
    assert archive is not None
    assert names(archive.data) == ["wd/events.jsonl", "wd/main.py"]


def test_the_project_object_names_its_private_paths(tmp_path: Path) -> None:
    root = uninitialised_project(tmp_path / "project")
    elsewhere = tmp_path / "states" / "prod.json"
    private = Project(root, state_path=elsewhere).private_paths()
    assert private.covers(str((root / ".dstack" / "secrets.yml").resolve()))
    assert private.covers(str(elsewhere.parent.resolve() / "prod.json.backup"))
    assert not private.covers(str((root / "train.py").resolve()))


def test_listing_a_private_file_or_a_link_to_one_is_refused(tmp_path: Path) -> None:
    root = uninitialised_project(tmp_path / "project")
    (root / "innocent").symlink_to(".dstack/secrets.yml")
    private = private_paths(root)
    for listed in (".dstack/secrets.yml", ".dstack", "innocent", "sub/.dstack/state.json"):
        with pytest.raises(CodeError, match="never sent"):
            code_fingerprint(task(files=[listed]), root, run="task.train", private=private)
    # an absolute link into the private dir, inside a packed tree
    write(root, {"tree/a.py": "a"})
    (root / "tree" / "s").symlink_to(root / ".dstack" / "secrets.yml")
    with pytest.raises(CodeError, match="tree/s|s is a symlink"):
        pack(task(files=["tree"]), root, private=private)


def test_a_symlink_out_of_the_tree_is_a_plan_error_naming_it(tmp_path: Path) -> None:
    home = write(tmp_path / "home", {".aws/credentials": "aws_secret_access_key = x\n"})
    repo = write(home / "src" / "repo", {"train.py": "t"})
    (repo / "creds").symlink_to("../../.aws/credentials")
    with pytest.raises(CodeError) as e:
        code_fingerprint(task(repos=["."]), repo, run="task.train")
    message = str(e.value)
    assert "task.train" in message and "creds" in message
    assert "'../../.aws/credentials'" in message and str(home / ".aws" / "credentials") in message
    with pytest.raises(CodeError, match="creds is a symlink to '/"):
        (repo / "creds").unlink()
        (repo / "creds").symlink_to(home / ".aws" / "credentials")
        pack(task(files=["."]), repo)
    # ignored, it is no concern of the run's
    (repo / ".dstackignore").write_text("creds\n")
    archive = pack(task(files=["."]), repo)
    assert archive is not None and names(archive.data) == ["wd/.dstackignore", "wd/train.py"]


def test_in_tree_links_and_out_of_tree_directories_and_dangling_links_still_pack(
    tmp_path: Path,
) -> None:
    write(tmp_path / "elsewhere", {"x": "x"})
    repo = write(tmp_path / "repo", {"lib/real.py": "r"})
    (repo / "link.py").symlink_to("lib/real.py")
    (repo / "lib" / "up.py").symlink_to("../link.py")
    (repo / "outdir").symlink_to(tmp_path / "elsewhere")  # a directory: skipped with a warning
    (repo / "gone").symlink_to(tmp_path / "missing")  # dangling out of the tree: skipped
    archive = pack(task(files=["."]), repo)
    assert archive is not None
    assert names(archive.data) == ["wd/lib/real.py", "wd/lib/up.py", "wd/link.py"]


def test_a_link_listed_itself_sends_the_file_with_its_private_mode(tmp_path: Path) -> None:
    home = write(tmp_path / "home", {".aws/credentials": "key\n"})
    (home / ".aws" / "credentials").chmod(0o600)
    repo = write(tmp_path / "repo", {"train.py": "t"})
    (repo / "creds").symlink_to(home / ".aws" / "credentials")
    archive = pack(task(files=["creds:~/.aws/credentials"]), repo)
    assert archive is not None
    assert modes(archive.data) == {"home/.aws/credentials": "0o600"}


def test_modes_are_kept_from_packing_to_the_job(tmp_path: Path) -> None:
    src = write(tmp_path / "src", {"key.pem": "k", "run.sh": "r", "own.sh": "o", "doc.md": "d"})
    given = {"key.pem": 0o600, "run.sh": 0o755, "own.sh": 0o700, "doc.md": 0o664}
    for name, mode in given.items():
        (src / name).chmod(mode)
    archive = pack(task(files=["src:."]), tmp_path)
    assert archive is not None
    expected = {"key.pem": 0o600, "run.sh": 0o755, "own.sh": 0o700, "doc.md": 0o644}
    assert modes(archive.data) == {f"wd/{n}": oct(m) for n, m in expected.items()}
    blob = tmp_path / "blob.tar.gz"
    blob.write_bytes(archive.data)

    # the process runtime's unpack
    out = tmp_path / "out"
    out.mkdir()
    unpack(blob, {WD: out, HOME: tmp_path / "home", ABS: tmp_path / "abs"})
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == expected
    # the docker runtime's repack (extracted at / by put_archive)
    with tarfile.open(fileobj=io.BytesIO(repack(blob, {WD: "/w", HOME: "/h", ABS: "/"}))) as tar:
        assert {m.name: m.mode for m in tar.getmembers()} == {
            f"w/{n}": m for n, m in expected.items()
        }


def test_an_old_archive_keeps_its_modes(tmp_path: Path) -> None:
    """Archives packed before private modes (0644/0755 only) unpack as they always did."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, mode in (("wd/a", 0o644), ("wd/b", 0o755)):
            info = tarfile.TarInfo(name)
            info.mode, info.size = mode, 1
            tar.addfile(info, io.BytesIO(b"x"))
    blob = tmp_path / "old.tar.gz"
    blob.write_bytes(buffer.getvalue())
    out = tmp_path / "out"
    out.mkdir()
    unpack(blob, {WD: out, HOME: out, ABS: out})
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        "a": "0o644",
        "b": "0o755",
    }
    assert os.access(out / "b", os.X_OK)
