"""What leaves this machine with a run's code, against real git and a real agent: never a
project's `.dstack/`, never a file a committed symlink leads to outside the repo; private
files stay private in the job; a blob leaves the host with its last job."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.config.runs import TaskSpec
from dstack_plan.runs.code_archive import CodeArchive, CodeError, pack, private_paths
from dstack_plan.runs.code_upload import ensure_code, submit_with_code
from tests.infra.agent_process import AgentProcess

SECRET = "repo-secret-91c2"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers())


def repos_dot() -> TaskSpec:
    return TaskSpec.model_validate(
        {"type": "task", "name": "train", "commands": ["ls"], "repos": ["."]}
    )


@needs_git
def test_a_committed_dstack_dir_is_not_sent_from_a_git_repo(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / ".dstack").mkdir(parents=True)
    (root / "train.py").write_text("t\n")
    (root / ".dstack" / "secrets.yml").write_text(f"T: {SECRET}\n")
    (root / ".dstack" / "state.json").write_text("{}")
    git(root, "init", "-q")
    git(root, "add", "-f", ".")  # committed by mistake
    git(root, "commit", "-q", "-m", "oops")
    (root / ".dstack" / "ui-token").write_text("untracked, not ignored")
    archive = pack(repos_dot(), root, private=private_paths(root))
    assert archive is not None
    assert names(archive.data) == ["wd/train.py"]
    assert SECRET.encode() not in archive.data


@needs_git
def test_a_committed_link_out_of_the_repo_is_a_plan_error(tmp_path: Path) -> None:
    (tmp_path / "home" / ".aws").mkdir(parents=True)
    (tmp_path / "home" / ".aws" / "credentials").write_text("aws_secret_access_key = s\n")
    root = tmp_path / "home" / "src" / "repo"
    root.mkdir(parents=True)
    (root / "train.py").write_text("t\n")
    (root / "creds").symlink_to("../../.aws/credentials")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "a link")
    with pytest.raises(CodeError, match=r"creds is a symlink to '\.\./\.\./\.aws/credentials'"):
        pack(repos_dot(), root, run="task.train")


async def test_private_modes_reach_the_job_and_the_blob_goes_with_its_last_job(
    agent: AgentProcess, tmp_path: Path
) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    given = {"key.pem": 0o600, "tool.sh": 0o700, "run.sh": 0o755, "doc.md": 0o644}
    for name, mode in given.items():
        (src / name).write_text("#!/bin/sh\n")
        (src / name).chmod(mode)
    spec = TaskSpec.model_validate(
        {"type": "task", "name": "train", "commands": ["ls"], "files": ["."]}
    )
    archive = pack(spec, src)
    assert isinstance(archive, CodeArchive)
    client = agent.client()
    blob = agent.data_dir / "blobs" / archive.sha256
    await ensure_code(client, archive)
    assert blob.is_file()

    jobs = ("modes-1", "modes-2")
    for job_id in jobs:
        job = JobSpec(
            id=job_id,
            run_name="train",
            commands=["stat -c '%a %n' doc.md key.pem run.sh tool.sh"],
            code=archive.sha256,
        )
        await submit_with_code(client, job, archive)
        info = await client.wait(job_id, timeout=15)
        logs = await client.read_all_logs(job_id)
        assert info.status.value == "done", (info.termination_message, logs)
        assert logs == b"644 doc.md\n600 key.pem\n755 run.sh\n700 tool.sh\n"

    await client.delete(jobs[0])
    assert blob.is_file() and await client.has_blob(archive.sha256)  # modes-2 names it
    await client.delete(jobs[1])
    assert not blob.exists() and not await client.has_blob(archive.sha256)

    # a submission that finds its blob removed meanwhile uploads it again
    again = JobSpec(id="modes-3", run_name="train", commands=["true"], code=archive.sha256)
    await submit_with_code(client, again, archive)
    info = await client.wait("modes-3", timeout=15)
    assert info.status.value == "done", info.termination_message
