"""A job's SSH access, without processes: the `ssh` spec field, the job server's sshd_config,
the session a login becomes (`ssh_session.py`), and what apply puts in a dev environment's job."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobSpec, SSHAccess
from dstack_plan.agent.job_sshd import SSHDError, SSHServer, sshd_config
from dstack_plan.agent.spec import SpecError, parse_job_spec
from dstack_plan.agent.ssh_session import LOGIN_SHELL, SessionError, plan_session
from dstack_plan.config.runs import DevEnvironmentSpec, TaskSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job, job_demands
from dstack_plan.runs.submission import dev_environment_key

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOq0 dstack-plan"


def spec(**fields: Any) -> dict[str, Any]:
    return {"run_name": "dev", "commands": ["sleep 1"], **fields}


def test_the_ssh_field_is_kept_and_sent_only_when_set() -> None:
    parsed = parse_job_spec(spec(ssh={"public_key": KEY}))
    assert parsed.ssh is not None and parsed.ssh.public_key == KEY
    assert parsed.to_dict()["ssh"] == {"public_key": KEY}
    assert "ssh" not in parse_job_spec(spec()).to_dict()  # as older agents wrote records
    wire = JobSpec(run_name="dev", commands=["x"], ssh=SSHAccess(public_key=KEY)).to_wire()
    assert wire["ssh"] == {"public_key": KEY}
    assert "ssh" not in JobSpec(run_name="dev", commands=["x"]).to_wire()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"public_key": KEY, "extra": 1}, "ssh"),
        ("ssh-ed25519 AAAA", "ssh"),
        ({"public_key": KEY + "\nssh-rsa AAAA second"}, "ssh.public_key"),
        ({"public_key": f'command="/bin/sh" {KEY}'}, "ssh.public_key"),
        ({"public_key": "not a key"}, "ssh.public_key"),
    ],
)
def test_a_bad_ssh_field_is_refused(value: Any, field: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_job_spec(spec(ssh=value))
    assert [f for f, _ in raised.value.problems] == [field]


def test_the_server_listens_on_loopback_and_lets_in_one_user_by_key(tmp_path: Path) -> None:
    directory = tmp_path / "job dir" / "sshd"
    config = sshd_config(directory, 40123, "root")
    lines = dict(line.split(" ", 1) for line in config.splitlines())
    assert lines["ListenAddress"] == "127.0.0.1:40123"
    assert lines["AllowUsers"] == "root"
    assert lines["AuthenticationMethods"] == "publickey"
    assert lines["PasswordAuthentication"] == "no"
    assert lines["AllowTcpForwarding"] == "local"
    assert lines["AuthorizedKeysFile"] == f'"{directory}/authorized_keys"'
    force = shlex.split(lines["ForceCommand"])  # one shell word each, spaces and all
    assert force[1:] == [str(directory / "session.py"), str(directory / "session.json")]
    with pytest.raises(SSHDError):
        sshd_config(tmp_path / "100%", 40123, "root")


def test_the_servers_record_keeps_its_pid_and_the_info_does_not() -> None:
    server = SSHServer(40123, "ssh-ed25519 AAAA", "root", "/w", pid=7, pid_start=99)
    assert server.info() == {
        "port": 40123,
        "host_key": "ssh-ed25519 AAAA",
        "user": "root",
        "working_dir": "/w",
    }
    assert SSHServer.from_record(server.record()) == server
    assert SSHServer(error="no sshd").info() == {"error": "no sshd"}


DOCKER = {"runtime": "docker", "docker": "/usr/bin/docker", "container": "c1", "sftp_marker": "/m"}


def test_a_command_enters_the_container_as_one_argv_word() -> None:
    command = "echo 'a b' $HOME; rm -rf \"x\""
    session = plan_session(DOCKER, {"SSH_ORIGINAL_COMMAND": command, "PATH": "/bin"})
    assert session.argv == ["/usr/bin/docker", "exec", "-i", "c1", "/bin/sh", "-c", command]
    tty = plan_session(DOCKER, {"SSH_TTY": "/dev/pts/1", "TERM": "xterm"})
    assert tty.argv == [
        "/usr/bin/docker", "exec", "-i", "-t", "-e", "TERM=xterm", "c1", "/bin/sh", "-c",
        LOGIN_SHELL,
    ]  # fmt: skip
    sftp = plan_session(DOCKER, {"SSH_ORIGINAL_COMMAND": "/m", "SSH_TTY": "/dev/pts/1"})
    assert sftp.argv[:4] == ["/usr/bin/docker", "exec", "-i", "c1"]
    assert "sftp-server" in sftp.argv[-1]
    with pytest.raises(SessionError, match="docker CLI"):
        plan_session({**DOCKER, "docker": None}, {})


def test_a_process_session_runs_in_the_jobs_dir_with_its_env() -> None:
    config = {"runtime": "process", "working_dir": "/w", "env": {"A": "1"}, "sftp_marker": "/m"}
    session = plan_session(config, {"SSH_ORIGINAL_COMMAND": "pwd", "A": "0", "B": "2"})
    assert session.argv[1:] == ["-c", "pwd"] and session.cwd == "/w"
    assert (session.env["A"], session.env["B"]) == ("1", "2")
    assert plan_session(config, {}).argv[1:] == ["-l"]
    with pytest.raises(SessionError, match="sftp-server"):
        plan_session({**config, "sftp_server": None}, {"SSH_ORIGINAL_COMMAND": "/m"})
    with pytest.raises(SessionError, match="does not exist"):
        plan_session({**config, "user": "no-such-user-here"}, {})


CTX = JobContext("dev", "d/dev", 1, "abc123", 1, "127.0.0.1", ("127.0.0.1",))
SMALL = {"cpu": 1, "memory": "1GB", "disk": "1GB.."}


def test_a_dev_environments_job_gets_the_project_key_and_the_host_network(
    tmp_path: Path,
) -> None:
    dev = DevEnvironmentSpec.model_validate(
        {"type": "dev-environment", "name": "dev", "image": "busybox", "ports": [8888]}
        | {"resources": SMALL}
    )
    key = dev_environment_key(dev, str(tmp_path))
    assert key is not None and key.startswith("ssh-ed25519 ")
    assert (tmp_path / ".dstack" / "ssh" / "id_ed25519").stat().st_mode & 0o777 == 0o600
    job = build_job(dev, JobSlot(0, 0), CTX, SecretStore("."), environ={}, ssh_public_key=key)
    assert job.ssh == SSHAccess(public_key=key)
    # the IDE's forwards through the session arrive on the host's loopback: so must its ports
    assert job.network_mode == "host"
    assert [d.ports for d in job_demands(dev)] == [(8888,)]
    task = TaskSpec.model_validate({"type": "task", "commands": ["x"], "resources": SMALL})
    assert dev_environment_key(task, str(tmp_path)) is None
    assert build_job(task, JobSlot(0, 0), CTX, SecretStore("."), environ={}).ssh is None
