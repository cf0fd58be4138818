"""A fleet shared across projects: the platform project exports its fleet `gpu` to project
`ml`, whose runs name `fleets: [platform/gpu]` (or `{project: platform, name: gpu}`) and run
on platform's host, reached with ml's own SSH identity (`.dstack/projects.yml`); a project
the export does not name is refused; revoking the export refuses new placements and leaves
ml's running job alone (ml can still stop it). Real sshd hosts in network namespaces, one
agent per host, the host with a fake `nvidia-smi`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.runs.usage import day_start
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import fleet_text, remote  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]


def _ok(done) -> None:  # noqa: ANN001 - CompletedProcess
    assert done.returncode == 0, done.stdout + done.stderr


def _task(name: str, fleets: str, gpu: int = 1) -> str:
    return (
        f"type: task\nname: {name}\nfleets: {fleets}\ncommands: ['sleep 600']\n"
        f"stop_duration: 1s\nresources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: {gpu}}}\n"
    )


def _projects_file(project: Path, owner: Path, key: Path) -> None:
    (project / ".dstack").mkdir(parents=True, exist_ok=True)
    (project / ".dstack" / "projects.yml").write_text(
        f"projects:\n  platform:\n    state: {owner}/.dstack/state.json\n"
        f"    ssh: {{identity_file: {key}}}\n"
    )


def _rows(dstack: Dstack, project: Path) -> dict[str, dict]:
    done = dstack("ps", "--json", cwd=project)
    assert done.returncode == 0, done.stderr
    return {r["address"]: r for r in json.loads(done.stdout)}


def test_an_exported_fleet_runs_the_importer_s_jobs_until_the_export_is_revoked(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    platform, ml, other = tmp_path / "platform", tmp_path / "ml", tmp_path / "other"
    for directory in (platform, ml, other):
        directory.mkdir()
    (platform / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "gpu", "gpu"))
    _ok(dstack("apply", "-y", cwd=platform))

    # ml names platform's state and logs in with its own key: no key file of platform's
    _projects_file(ml, platform, ssh_hosts.client_key)
    (ml / "train.dstack.yml").write_text(_task("train", "[platform/gpu]"))
    refused = dstack("plan", cwd=ml)
    assert refused.returncode == 1
    assert "fleet 'gpu' of project 'platform' is not exported to project 'ml'" in refused.stderr

    created = dstack("export", "create", "share", "--fleet", "gpu", "--importer",
                     f"ml={ml}/.dstack/state.json", cwd=platform)  # fmt: skip
    _ok(created)
    listed = json.loads(dstack("export", "list", "--json", cwd=platform).stdout)
    assert listed == [
        {
            "name": "share",
            "fleets": ["gpu"],
            "gateways": [],
            "importers": [{"project": "ml", "state": f"{ml}/.dstack/state.json"}],
        }
    ]
    before = (platform / ".dstack" / "state.json").read_bytes()

    _ok(dstack("apply", "-y", cwd=ml))
    train = _rows(dstack, ml)["task.train"]
    assert train["status"] == "running"
    assert state(ml)["resources"]["task.train"]["attributes"]["fleet"] == "platform/gpu"
    # the importer read platform's state and never wrote it
    assert (platform / ".dstack" / "state.json").read_bytes() == before
    # the imported fleet is listed with its owner, and `top` asks its host's agent
    fleets = json.loads(dstack("fleet", "list", "--json", cwd=ml).stdout)["fleets"]
    assert [(f["name"], f.get("owner")) for f in fleets] == [("platform/gpu", "platform")]
    top = json.loads(dstack("top", "--json", cwd=ml).stdout)
    [host] = [h for h in top["hosts"] if h["fleet"] == "platform/gpu"]
    assert (host["host"], host["agent"], host["gpus_used"]) == (ssh_hosts["gpu"].address, "ok", 1)
    small = ["--cpu", "1..", "--memory", "0.1GB..", "--disk", "1GB.."]
    offered = json.loads(dstack("offer", *small, "--json", cwd=ml).stdout)["offers"]
    [row] = [r for r in offered if r["fleet"] == "platform/gpu"]
    assert row["host"] == ssh_hosts["gpu"].address

    # the mapping form names the same fleet; the GPU is taken, a CPU-only run fits beside it
    (ml / "probe.dstack.yml").write_text(_task("probe", "[{project: platform, name: gpu}]", gpu=0))
    planned = dstack("plan", "--json", cwd=ml)
    assert planned.returncode == 0, planned.stderr
    [probe] = [
        c for c in json.loads(planned.stdout)["resource_changes"] if c["address"] == "task.probe"
    ]
    assert probe["placement"]["fleet"] == "platform/gpu"
    assert probe["placement"]["hosts"] == [ssh_hosts["gpu"].address]
    (ml / "probe.dstack.yml").unlink()

    # a project the export does not name is refused, naming itself and the owner
    _projects_file(other, platform, ssh_hosts.client_key)
    (other / "steal.dstack.yml").write_text(_task("steal", "[platform/gpu]", gpu=0))
    stolen = dstack("apply", "-y", cwd=other)
    assert stolen.returncode == 1
    assert "fleet 'gpu' of project 'platform' is not exported to project 'other'" in stolen.stderr
    assert "Traceback" not in stolen.stderr

    # revoked: no new job goes there; the running one keeps running, and ml can still stop it
    _ok(dstack("export", "delete", "share", cwd=platform))
    (ml / "more.dstack.yml").write_text(_task("more", "[platform/gpu]", gpu=0))
    more = dstack("apply", "-y", cwd=ml)
    assert more.returncode == 1
    assert "is not exported to project 'ml'" in more.stderr
    assert _rows(dstack, ml)["task.train"]["status"] == "running"
    (ml / "more.dstack.yml").unlink()
    kept = dstack("plan", "--detailed-exitcode", cwd=ml)  # what runs there is no change
    assert kept.returncode == 0, kept.stdout + kept.stderr
    _ok(dstack("destroy", "-y", cwd=ml))
    assert "task.train" not in _rows(dstack, ml)
    _ok(dstack("destroy", "-y", cwd=platform))


def test_an_unknown_owner_or_fleet_is_a_plan_error_naming_it(
    dstack: Dstack, tmp_path: Path
) -> None:
    ml = tmp_path / "ml"
    ml.mkdir()
    (ml / "train.dstack.yml").write_text(_task("train", "[platform/gpu]", gpu=0))
    unknown = dstack("plan", cwd=ml)
    assert unknown.returncode == 1
    assert "project 'platform' is not in .dstack/projects.yml" in unknown.stderr

    owner = tmp_path / "platform"
    owner.mkdir()
    _projects_file(ml, owner, tmp_path / "key")
    unread = dstack("plan", cwd=ml)  # platform has no state yet: an empty one, no fleet
    assert unread.returncode == 1
    assert "fleet 'gpu' of project 'platform': its state has no such fleet" in unread.stderr
    assert "Traceback" not in unknown.stderr + unread.stderr


def test_the_owner_s_limits_bind_the_importer_at_plan_and_in_the_owner_s_watch(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """platform's `.dstack/quotas.yml` limits project ml on its fleets: published by
    platform's apply, obeyed by ml's plan (no GPU at all), then a daily GPU-hours limit ml
    goes over is enforced by platform's watch, which stops ml's GPU job on platform's host."""
    platform, ml = tmp_path / "platform", tmp_path / "ml"
    for directory in (platform, ml):
        directory.mkdir()
    (platform / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "gpu", "gpu"))
    quotas = platform / ".dstack" / "quotas.yml"
    quotas.parent.mkdir()
    quotas.write_text("projects:\n  ml: {gpus: 0}\n")
    applied = dstack("apply", "-y", cwd=platform)
    _ok(applied)
    assert "Published the projects' limits" in applied.stdout
    assert state(platform)["policy"] == {"projects": {"ml": {"gpus": 0}}}
    _ok(dstack("export", "create", "share", "--fleet", "gpu", "--importer",
               f"ml={ml}/.dstack/state.json", cwd=platform))  # fmt: skip
    _projects_file(ml, platform, ssh_hosts.client_key)
    (ml / "train.dstack.yml").write_text(_task("train", "[platform/gpu]"))

    over = dstack("plan", cwd=ml)
    assert over.returncode == 1
    assert "project ml: gpus limit 0, 0 in use, task.train asks 1" in over.stderr

    # 36 GPU-seconds a day: ml may start (nothing used yet); an hour on, it is over
    quotas.write_text("projects:\n  ml: {gpu_hours_per_day: 0.01}\n")
    _ok(dstack("apply", "-y", cwd=platform))  # no changes: the new limits are published
    _ok(dstack("apply", "-y", cwd=ml))
    assert _rows(dstack, ml)["task.train"]["status"] == "running"

    for name in ("HOME", "DSTACK_PLAN_SSH_AGENT_DIR", "DSTACK_PLAN_AGENT_DIR"):
        monkeypatch.setenv(name, cli_env[name])
    # an hour on: the job used about one GPU-hour today; when that hour crosses midnight
    # (UTC, as usage counts days), an hour into the next day, so today still holds one
    later = time.time() + 3600
    clock = FakeClock(max(later, day_start(later) + 3600))
    owner = Project(platform, clock=clock)
    watcher = Watcher(owner, events=EventLog(owner.backend))

    async def tick() -> None:
        try:
            await watcher.tick()
        finally:
            await owner.close()

    asyncio.run(tick())
    events = [
        json.loads(line) for line in dstack("events", "--json", cwd=platform).stdout.splitlines()
    ]
    [stopped] = [e for e in events if "quota_exceeded" in (e.get("reason") or "")]
    assert "project ml: gpu_hours_per_day limit 0.01, 1 used today" in stopped["reason"]
    assert "run task.train of project ml" in stopped["reason"]
    assert _rows(dstack, ml)["task.train"]["status"] in ("terminated", "terminating")
    _ok(dstack("destroy", "-y", cwd=ml))
    _ok(dstack("destroy", "-y", cwd=platform))
