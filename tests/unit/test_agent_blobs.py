"""The agent's blob store and the unpacking of code archives, crafted ones included."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.blobs import BlobError, BlobStore, UnpackError, repack, unpack
from dstack_plan.agent.spec import SpecError, parse_job_spec

SPECIAL = (tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE)


def craft(path: Path, *members: tuple[str, bytes | str]) -> Path:
    """A tar.gz of (name, content): bytes = file (or one of the SPECIAL tarfile types),
    str = symlink target."""
    with tarfile.open(path, "w:gz") as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if what in SPECIAL:
                assert isinstance(what, bytes)
                info.type = what
                info.linkname = "wd/a" if what == tarfile.LNKTYPE else ""
                tar.addfile(info)
            elif isinstance(what, bytes):
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, what
                tar.addfile(info)
    return path


def roots(tmp_path: Path) -> dict[str, Path]:
    return {"wd": tmp_path / "work", "home": tmp_path / "home", "abs": tmp_path / "root"}


def test_put_verifies_the_hash_and_stores_nothing_on_a_mismatch(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    body = b"archive bytes"
    sha = hashlib.sha256(body).hexdigest()
    with pytest.raises(BlobError) as e:
        store.put(sha, io.BytesIO(b"tampered bytes"), len(body) + 1)
    assert e.value.status == 400 and e.value.code == "sha256_mismatch"
    assert not store.has(sha) and list((tmp_path / "blobs").iterdir()) == []
    with pytest.raises(BlobError, match="ended after 5 of 13"):
        store.put(sha, io.BytesIO(body[:5]), len(body))
    assert store.put(sha, io.BytesIO(body), len(body)) is True
    assert store.has(sha) and store.path(sha).read_bytes() == body
    assert store.put(sha, io.BytesIO(body), len(body)) is False  # already there
    with pytest.raises(BlobError, match="not a sha256"):
        store.has("../../etc/passwd")


def test_unpack_places_each_root(tmp_path: Path) -> None:
    archive = craft(
        tmp_path / "a.tgz",
        ("wd/src/main.py", b"main"),
        ("wd/src/link", "main.py"),
        ("home/.config/x", b"x"),
        ("abs/opt/app/y", b"y"),
    )
    assert unpack(archive, roots(tmp_path)) == 4
    assert (tmp_path / "work/src/main.py").read_bytes() == b"main"
    assert (tmp_path / "work/src/link").readlink() == Path("main.py")
    assert (tmp_path / "home/.config/x").read_bytes() == b"x"
    assert (tmp_path / "root/opt/app/y").read_bytes() == b"y"


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (("wd/../../escape", b"x"), "'..'"),
        (("/etc/evil", b"x"), "absolute"),
        (("elsewhere/x", b"x"), "members must be under"),
        (("wd/up", "../../outside"), "leaves its directory"),
        (("wd/abs-link", "/etc/passwd"), "leaves its directory"),
        (("wd/hard", tarfile.LNKTYPE), "hard link"),
        (("wd/dev", tarfile.CHRTYPE), "device"),
        (("wd/fifo", tarfile.FIFOTYPE), "fifo"),
        (("wd", b"x"), "cannot replace"),
    ],
)
@pytest.mark.parametrize("data_filter", [True, False], ids=["data-filter", "own-checks"])
def test_crafted_members_are_refused_before_anything_is_written(
    tmp_path: Path,
    member: tuple[str, bytes | str],
    message: str,
    data_filter: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not data_filter:  # as on pythons older than tarfile's extraction filters
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = craft(tmp_path / "bad.tgz", ("wd/a", b"first"), member)
    with pytest.raises(UnpackError, match=message):
        unpack(archive, roots(tmp_path))
    assert not (tmp_path / "work" / "a").exists()
    assert not (tmp_path / "escape").exists()
    with pytest.raises(UnpackError, match=message):
        repack(archive, {"wd": "/w", "home": "/root", "abs": "/"})


def test_writing_through_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "sneaky").symlink_to(outside)  # left there before the job
    archive = craft(tmp_path / "a.tgz", ("wd/sneaky/file", b"x"))
    with pytest.raises(UnpackError, match="outside"):
        unpack(archive, roots(tmp_path))
    assert list(outside.iterdir()) == []


def test_an_existing_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("keep")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "f").symlink_to(target)
    unpack(craft(tmp_path / "a.tgz", ("wd/f", b"new")), roots(tmp_path))
    assert target.read_text() == "keep"
    assert not (tmp_path / "work" / "f").is_symlink()
    assert (tmp_path / "work" / "f").read_bytes() == b"new"


def test_repack_names_members_by_absolute_path_for_put_archive(tmp_path: Path) -> None:
    archive = craft(
        tmp_path / "a.tgz",
        ("wd/run.sh", b"#!/bin/sh\n"),
        ("home/.netrc", b"n"),
        ("abs/etc/app.yml", b"a"),
        ("wd/l", "run.sh"),
    )
    data = repack(archive, {"wd": "/workspace", "home": "/home/u", "abs": "/"}, 1000, 1000)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        found = {m.name: (m.uid, m.gid, m.linkname) for m in tar.getmembers()}
    assert found == {
        "workspace/run.sh": (1000, 1000, ""),
        "home/u/.netrc": (1000, 1000, ""),
        "etc/app.yml": (1000, 1000, ""),
        "workspace/l": (1000, 1000, "run.sh"),
    }


def test_a_job_spec_names_its_code_by_sha256() -> None:
    sha = "ab" * 32
    wire = JobSpec(run_name="r", commands=["ls"], code=sha).to_wire()
    assert wire["code"] == sha
    assert parse_job_spec(wire).to_dict()["code"] == sha
    assert "code" not in JobSpec(run_name="r", commands=["ls"]).to_wire()  # old agents accept it
    with pytest.raises(SpecError, match="code: must be the sha256"):
        parse_job_spec({"run_name": "r", "commands": ["ls"], "code": "../../x"})
