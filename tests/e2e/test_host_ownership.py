"""Two projects on one cluster: a host belongs to one project's fleet, recorded by its agent.

Project A runs a long two-node task on hosts h1-h2; project B declares a fleet with h2 and
another with h3. B's plan and apply are refused naming A's fleet, project and state; with
`--take-over` too, while A's jobs run there; B's destroy of its own fleet leaves A's jobs and
agents running; a stale claim (A's state gone) is taken over with a notice; and A's destroy
stops the agents no one else needs. Real sshd hosts in network namespaces, both projects'
agents under one agent dir (one agent per host, as on a real cluster).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import agents_running, fleet_text, remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_runs import task
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]


def _ok(done) -> None:  # noqa: ANN001 - CompletedProcess
    assert done.returncode == 0, done.stdout + done.stderr


def _running(dstack: Dstack, project: Path, address: str) -> bool:
    rows = json.loads(dstack("ps", "--json", cwd=project).stdout)
    row = next((r for r in rows if r["address"] == address), None)
    return row is not None and row["status"] == "running"


def test_a_host_belongs_to_one_project(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    a, b = tmp_path / "platform", tmp_path / "ml"
    a.mkdir()
    b.mkdir()
    h2 = ssh_hosts["h2"].address
    (a / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "onprem", "h1", "h2"))
    (a / "train.dstack.yml").write_text(task("train", 2, ["sleep 600"]))
    _ok(dstack("apply", "-y", cwd=a))
    assert _running(dstack, a, "task.train")

    (b / "mine.dstack.yml").write_text(fleet_text(ssh_hosts, "mine", "h3"))
    _ok(dstack("apply", "-y", cwd=b))
    (b / "theirs.dstack.yml").write_text(fleet_text(ssh_hosts, "theirs", "h2"))
    owner = f"{h2} belongs to fleet.onprem of project platform (state {a / '.dstack/state.json'})"
    planned = dstack("plan", cwd=b)
    assert planned.returncode == 1 and owner in planned.stderr, planned.stdout + planned.stderr
    assert "--take-over" in planned.stderr
    refused = dstack("apply", "-y", "--take-over", cwd=b)
    assert refused.returncode == 1
    assert "whose jobs run there (train)" in refused.stdout + refused.stderr
    assert _running(dstack, a, "task.train")

    # B tears its own fleet down: A's jobs and agents are untouched
    (b / "theirs.dstack.yml").unlink()
    _ok(dstack("destroy", "-y", cwd=b))
    assert agents_running(remote) == {"h1", "h2"}
    assert _running(dstack, a, "task.train")

    # A's state is gone (its directory deleted) while its agents keep their claims: the claim
    # is stale once nothing of A runs there, and B takes it over, saying so
    _ok(dstack("stop", "train", "-y", cwd=a))
    shutil.rmtree(a / ".dstack")
    (b / "theirs.dstack.yml").write_text(fleet_text(ssh_hosts, "theirs", "h2"))
    taken = dstack("apply", "-y", cwd=b)
    _ok(taken)
    assert "took over a stale claim of fleet.onprem of project platform" in taken.stdout
    assert "its state no longer exists" in taken.stdout
    _ok(dstack("destroy", "-y", cwd=b))
    assert "h2" not in agents_running(remote)


def test_a_second_project_s_destroy_never_stops_the_owner_s_agent(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    """The defect as reported: B's fleet listing A's host passed, and B's destroy stopped
    the agent under A's running service."""
    a, b = tmp_path / "platform", tmp_path / "ml"
    a.mkdir()
    b.mkdir()
    (a / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "onprem", "h1"))
    (a / "train.dstack.yml").write_text(task("train", 1, ["sleep 600"]))
    _ok(dstack("apply", "-y", cwd=a))
    (b / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "shared", "h1"))
    assert dstack("apply", "-y", cwd=b).returncode == 1
    # whatever B's state says after the refused create, destroying it spares A
    _ok(dstack("destroy", "-y", cwd=b))
    assert agents_running(remote) == {"h1"}
    assert _running(dstack, a, "task.train")
    assert "fleet.shared" not in state(b).get("resources", {})
    _ok(dstack("destroy", "-y", cwd=a))
    assert agents_running(remote) == set()


def test_a_renamed_fleet_keeps_its_hosts_agent(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    """Renaming a fleet creates the new one and deletes the old one in either order: the old
    one's release never stops the agent the new one has claimed."""
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "old", "h1"))
    _ok(dstack("apply", "-y"))
    (project / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "new", "h1"))
    _ok(dstack("apply", "-y"))
    assert agents_running(remote) == {"h1"}
    [claims] = remote.glob("hosts/h1/data/claims.json")
    assert [c["fleet"] for c in json.loads(claims.read_text())] == ["fleet.new"]
    _ok(dstack("destroy", "-y"))
    assert agents_running(remote) == set()


def test_a_host_has_one_agent_whichever_user_logs_in(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    cli_env: dict[str, str],
) -> None:
    """A project reaching the host through another agent dir (another login user's home, as
    its `~/.dstack-plan`) would start a second agent handing out the same GPUs: refused,
    naming the agent that serves the host."""
    a, b = tmp_path / "platform", tmp_path / "ml"
    a.mkdir()
    b.mkdir()
    (a / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "onprem", "h1"))
    _ok(dstack("apply", "-y", cwd=a))
    (b / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "mine", "h1"))
    cli_env["DSTACK_PLAN_SSH_AGENT_DIR"] = str(tmp_path / "other-home")
    served = f"data in {remote}/hosts/h1/data"
    planned = dstack("plan", cwd=b)
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert "another agent serves this host" in planned.stderr and served in planned.stderr
    assert "log in as root" in planned.stderr
    assert not (tmp_path / "other-home").exists()  # nothing was installed
    cli_env["DSTACK_PLAN_SSH_AGENT_DIR"] = str(remote)
    _ok(dstack("destroy", "-y", cwd=a))


def test_take_over_moves_an_idle_host_and_says_so(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    a, b = tmp_path / "platform", tmp_path / "ml"
    a.mkdir()
    b.mkdir()
    (a / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "onprem", "h1"))
    _ok(dstack("apply", "-y", cwd=a))
    (b / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "mine", "h1"))
    assert dstack("apply", "-y", cwd=b).returncode == 1  # A's state still lists h1
    taken = dstack("apply", "-y", "--take-over", cwd=b)
    _ok(taken)
    assert "took over the claim of fleet.onprem of project platform" in taken.stdout
    claims = json.loads(next(remote.glob("hosts/h1/data/claims.json")).read_text())
    assert [(c["project"], c["fleet"]) for c in claims] == [("ml", "fleet.mine")]
    _ok(dstack("destroy", "-y", cwd=b))
    assert agents_running(remote) == set()


def test_a_teardown_keeps_an_agent_that_runs_another_project_s_jobs_unless_forced(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    """A host enrolled before claims existed (its claim file removed here) is shared by two
    projects' fleets: B's destroy releases its claim and keeps the agent A's task runs under,
    saying why; `destroy --force` stops A's task, then the agent."""
    a, b = tmp_path / "platform", tmp_path / "ml"
    a.mkdir()
    b.mkdir()
    (a / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "onprem", "h1"))
    (a / "train.dstack.yml").write_text(task("train", 1, ["sleep 600"]))
    _ok(dstack("apply", "-y", cwd=a))
    next(remote.glob("hosts/h1/data/claims.json")).unlink()  # as an older version left it
    (b / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "mine", "h1"))
    _ok(dstack("apply", "-y", cwd=b))
    kept = dstack("destroy", "-y", cwd=b)
    _ok(kept)
    assert "its agent keeps running: jobs run there that this project does not own (train" in (
        kept.stdout
    )
    assert agents_running(remote) == {"h1"} and _running(dstack, a, "task.train")
    _ok(dstack("apply", "-y", cwd=b))
    _ok(dstack("destroy", "-y", "--force", cwd=b))
    assert agents_running(remote) == set()
    assert not _running(dstack, a, "task.train")
