"""Code archives end to end: packed from a project dir, uploaded once to a real agent, unpacked
into process and docker jobs before their commands start."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.client import AgentClient
from dstack_plan.agent.protocol import MAX_REQUEST_BYTES
from dstack_plan.config.runs import TaskSpec
from dstack_plan.errors import AgentError
from dstack_plan.runs.code_archive import CodeArchive, pack
from dstack_plan.runs.code_upload import ensure_code
from tests.infra.agent_process import REPO_ROOT, AgentProcess


def project(root: Path) -> Path:
    for name, text in {
        "data.txt": "hello data\n",
        "src/main.py": "print('main')\n",
        "src/.dstackignore": "*.tmp\n",
        "src/scratch.tmp": "not sent\n",
        "conf/app.yml": "key: value\n",
    }.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def archive_of(root: Path, absolute: str) -> CodeArchive:
    spec = TaskSpec.model_validate(
        {
            "type": "task",
            "name": "train",
            "commands": ["true"],
            "files": ["data.txt", f"conf:{absolute}"],
            "repos": [{"local_path": "src", "path": "code"}],
        }
    )
    archive = pack(spec, root)
    assert archive is not None
    return archive


def crafted(*members: tuple[str, bytes]) -> tuple[str, bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return hashlib.sha256(data).hexdigest(), data


class CountingClient(AgentClient):
    """A real client that counts its uploads."""

    uploads = 0

    async def put_blob(self, sha256: str, data: bytes) -> None:
        self.uploads += 1
        await super().put_blob(sha256, data)


async def test_process_job_sees_files_in_its_working_dir_and_absolute_target(
    agent: AgentProcess, tmp_path: Path
) -> None:
    client = agent.client()
    absolute = tmp_path / "etc-app"
    archive = archive_of(project(tmp_path / "proj"), str(absolute))
    assert not await client.has_blob(archive.sha256)
    await ensure_code(client, archive)
    assert await client.has_blob(archive.sha256)
    await client.submit(
        JobSpec(
            id="code-p1",
            run_name="train",
            commands=[
                "cat data.txt code/main.py",
                "ls -A code",
                f"cat {absolute}/app.yml",
            ],
            code=archive.sha256,
        )
    )
    info = await client.wait("code-p1", timeout=15)
    logs = await client.read_all_logs("code-p1")
    assert info.status.value == "done", (info.termination_message, logs)
    assert logs == b"hello data\nprint('main')\n.dstackignore\nmain.py\nkey: value\n"


async def test_process_job_on_the_system_python_agent(agent_factory: Any, tmp_path: Path) -> None:
    """The agent as shipped runs on a bare python3 (here without tarfile's data filter)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3")
    bare: AgentProcess = agent_factory(
        "bare",
        command=[
            python,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from dstack_plan.agent.main import main; sys.exit(main())",
            str(REPO_ROOT),
        ],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    client = bare.client()
    archive = archive_of(project(tmp_path / "proj"), str(tmp_path / "abs"))
    await ensure_code(client, archive)
    await client.submit(
        JobSpec(id="code-bare", run_name="train", commands=["cat data.txt"], code=archive.sha256)
    )
    info = await client.wait("code-bare", timeout=15)
    assert info.status.value == "done", info.termination_message
    assert await client.read_all_logs("code-bare") == b"hello data\n"


@pytest.mark.docker
async def test_docker_job_sees_files_in_its_working_dir_and_absolute_target(
    agent: AgentProcess, busybox_image: str, tmp_path: Path
) -> None:
    client = agent.client()
    archive = archive_of(project(tmp_path / "proj"), "/opt/app")
    await ensure_code(client, archive)
    for job_id, working_dir, expected_dir in (
        ("code-d1", "/workspace", b"/workspace"),
        ("code-d2", None, b"/"),  # the image has no WORKDIR
    ):
        await client.submit(
            JobSpec(
                id=job_id,
                run_name="train",
                image=busybox_image,
                working_dir=working_dir,
                commands=["pwd", "cat data.txt code/main.py /opt/app/app.yml", "ls -A code"],
                code=archive.sha256,
            )
        )
        info = await client.wait(job_id, timeout=30)
        logs = await client.read_all_logs(job_id)
        assert info.status.value == "done", (info.termination_message, logs)
        assert logs == (
            expected_dir + b"\nhello data\nprint('main')\nkey: value\n.dstackignore\nmain.py\n"
        )


@pytest.mark.docker
async def test_docker_job_of_another_user_owns_its_files(
    agent: AgentProcess, busybox_image: str, tmp_path: Path
) -> None:
    client = agent.client()
    archive = archive_of(project(tmp_path / "proj"), "/opt/app")
    await ensure_code(client, archive)
    await client.submit(
        JobSpec(
            id="code-u1",
            run_name="train",
            image=busybox_image,
            working_dir="/workspace",
            user="1000:1000",
            commands=["stat -c '%u:%g' data.txt", "echo more >> data.txt", "cat data.txt"],
            code=archive.sha256,
        )
    )
    info = await client.wait("code-u1", timeout=30)
    logs = await client.read_all_logs("code-u1")
    assert info.status.value == "done", (info.termination_message, logs)
    assert logs == b"1000:1000\nhello data\nmore\n"


async def test_upload_is_skipped_when_the_agent_has_the_blob(
    agent: AgentProcess, tmp_path: Path
) -> None:
    client = CountingClient(agent.url, agent.token, timeout=5.0)
    archive = archive_of(project(tmp_path / "proj"), str(tmp_path / "abs"))
    await ensure_code(client, archive)
    await ensure_code(client, archive)
    assert client.uploads == 1
    # another controller (a fresh client) finds it there too
    other = CountingClient(agent.url, agent.token, timeout=5.0)
    await ensure_code(other, archive)
    assert other.uploads == 0


async def test_a_body_that_does_not_match_its_sha256_is_refused(agent: AgentProcess) -> None:
    client = agent.client()
    sha, data = crafted(("wd/a", b"a"))
    with pytest.raises(AgentError) as e:
        await client.put_blob(sha, data + b"tampered")
    assert e.value.status == 400 and "sha256" in str(e.value)
    assert not await client.has_blob(sha)
    with pytest.raises(AgentError) as e:
        await client.put_blob("not-a-hash", data)
    assert e.value.status == 400


async def test_uploads_need_the_token(agent: AgentProcess) -> None:
    sha, data = crafted(("wd/a", b"a"))
    stranger = AgentClient(agent.url, "wrong", timeout=5.0)
    with pytest.raises(AgentError) as e:
        await stranger.put_blob(sha, data)
    assert e.value.status == 401
    assert not await agent.client().has_blob(sha)


async def test_a_job_whose_archive_is_missing_is_refused_at_submit(agent: AgentProcess) -> None:
    client = agent.client()
    with pytest.raises(AgentError) as e:
        await client.submit(
            JobSpec(id="code-missing", run_name="train", commands=["true"], code="0" * 64)
        )
    assert e.value.status == 400 and "no uploaded archive" in str(e.value)
    assert await client.list_jobs() == []


async def test_a_crafted_archive_escaping_its_dir_fails_the_job_and_writes_nothing(
    agent: AgentProcess, tmp_path: Path
) -> None:
    client = agent.client()
    escape = agent.data_dir / "escaped.txt"
    sha, data = crafted(("wd/ok.txt", b"ok"), ("wd/../../../escaped.txt", b"gotcha"))
    await client.put_blob(sha, data)
    await client.submit(JobSpec(id="code-evil", run_name="train", commands=["ls"], code=sha))
    info = await client.wait("code-evil", timeout=15)
    assert info.status.value == "failed"
    assert "cannot unpack the code" in (info.termination_message or "")
    assert "'..'" in (info.termination_message or "")
    assert not escape.exists()
    assert not list(agent.data_dir.rglob("ok.txt"))


async def test_an_archive_larger_than_a_json_request_streams_to_disk(agent: AgentProcess) -> None:
    client = agent.client()
    data = os.urandom(MAX_REQUEST_BYTES * 3)
    sha = hashlib.sha256(data).hexdigest()
    await client.put_blob(sha, data)
    assert await client.has_blob(sha)
    assert (agent.data_dir / "blobs" / sha).read_bytes() == data
