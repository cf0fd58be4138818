"""A fleet host's status is dstack's instance status everywhere (issue 35): `busy` while a job
runs on it, of this project or of another one sharing the host, `idle` when none does, and
`unreachable` when its agent does not answer. `dstack fleet list` (table and --json), the UI's
`/api/fleets` and fleets page, and watch's `dstack_instances` metric all say it, as `top`
and `offer` see it.

The `gpu` namespace host has a fake `nvidia-smi` with one GPU; a task holding it runs as a
process of that host's agent (no image). The fleet is an SSH fleet: the implicit `local`
fleet is in none of these listings.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_fleet_exports import _projects_file, _rows, _task
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_ssh_fleet import agents_running, fleet_text, remote, write_fleet  # noqa: F401
from tests.e2e.test_ssh_top import HOLD_GPU
from tests.e2e.test_watch_metrics import samples
from tests.e2e.test_web_api import serving
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]


def _ok(done) -> str:  # noqa: ANN001 - CompletedProcess
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


def listed(dstack: Dstack, cwd: Path | None = None) -> dict[str, dict]:
    """Host name -> its entry in `fleet list --json` (every fleet's)."""
    document = json.loads(_ok(dstack("fleet", "list", "--json", cwd=cwd)))
    return {h["name"]: h for f in document["fleets"] for h in f["hosts"]}


def table_status(dstack: Dstack, host: str) -> str:
    """The STATUS cell of `host`'s row in the `fleet list` table."""
    lines = _ok(dstack("fleet", "list")).splitlines()
    assert lines[0].split()[:3] == ["FLEET", "HOST", "STATUS"]
    return next(line.split()[2] for line in lines[1:] if line.split()[1] == host)


def instances(dstack: Dstack, tmp_path: Path, cwd: Path | None = None) -> dict[str, float]:
    """`dstack_instances` of fleet `onprem` (or `gpu`) after one `watch --once`: status ->
    how many hosts."""
    out = tmp_path / "watch.prom"
    _ok(dstack("watch", "--once", "--metrics-file", str(out), cwd=cwd))
    found = {}
    for (name, labels), value in samples(out.read_text()).items():
        if name == "dstack_instances" and value:
            found[dict(labels)["status"]] = value
    return found


BY_HOST = ("fleet list --json", "fleet list", "/api/fleets", "/fleets page")


def surfaces(dstack: Dstack, tmp_path: Path, url: str, hosts: list[str]) -> dict[str, object]:
    """What each surface says of `hosts` now: `fleet list --json`, its table, `/api/fleets`,
    the UI's fleets page (host -> status), and `dstack_instances` (status -> count)."""
    api = httpx.get(url + "api/fleets", timeout=60)
    assert api.status_code == 200, api.text
    page = httpx.get(url + "fleets", timeout=60).text
    in_page = {}
    for host in hosts:
        found = re.search(rf"{re.escape(host)} \((\w+)\)", page)
        in_page[host] = found.group(1) if found else None
    by_json = listed(dstack)
    return {
        "fleet list --json": {h: by_json[h]["status"] for h in hosts},
        "fleet list": {h: table_status(dstack, h) for h in hosts},
        "/api/fleets": {h["name"]: h["status"] for f in api.json()["fleets"] for h in f["hosts"]},
        "/fleets page": in_page,
        "dstack_instances": instances(dstack, tmp_path),
    }


def expected(statuses: dict[str, str]) -> dict[str, object]:
    """`surfaces` when every one of them says `statuses` (host -> status)."""
    counts: dict[str, float] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    return {**{s: statuses for s in BY_HOST}, "dstack_instances": counts}


def ui_caught_up(url: str, statuses: dict[str, str]) -> None:
    """Until `/api/fleets` says `statuses` (its host snapshot is served while a newer one is
    fetched: `web/snapshots.py`), for 20 s at most (then `surfaces` shows what it says)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        fleets = httpx.get(url + "api/fleets", timeout=60).json()["fleets"]
        if {h["name"]: h["status"] for f in fleets for h in f["hosts"]} == statuses:
            return
        time.sleep(0.3)


def test_a_host_running_a_job_is_busy_in_fleet_list_the_ui_and_the_metric(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    cli_env: dict[str, str],
) -> None:
    project = tmp_path / "project"
    gpu, h1 = ssh_hosts["gpu"].address, ssh_hosts["h1"].address
    write_fleet(project, ssh_hosts, "gpu", "h1")
    _ok(dstack("apply", "-y"))
    try:
        with serving(["ui", "--bind", "127.0.0.1:0"], project, cli_env) as (url, _):
            # no job anywhere: both idle
            seen = surfaces(dstack, tmp_path, url, [gpu, h1])
            assert seen == expected({gpu: "idle", h1: "idle"})

            (project / "hold.dstack.yml").write_text(HOLD_GPU)
            _ok(dstack("apply", "-y"))
            wait_for_status(dstack, "task.hold", {"running"}, timeout=60)
            ui_caught_up(url, {gpu: "busy", h1: "idle"})
            seen = surfaces(dstack, tmp_path, url, [gpu, h1])
            assert seen == expected({gpu: "busy", h1: "idle"})
            # `offer` and `top` say the same of it
            small = ["--cpu", "1..", "--memory", "0.1GB..", "--disk", "1GB.."]
            offered = json.loads(_ok(dstack("offer", "--gpu", "1", *small, "--json")))["offers"]
            assert {r["host"]: r["availability"] for r in offered if r["fleet"] == "onprem"} == {
                gpu: "busy"
            }
            top = {h["host"]: h for h in json.loads(_ok(dstack("top", "--json")))["hosts"]}
            assert (top[gpu]["tasks"], top[h1]["tasks"]) == (1, 0)

            # the job stopped: idle again
            _ok(dstack("stop", "hold", "-y"))
            ui_caught_up(url, {gpu: "idle", h1: "idle"})
            seen = surfaces(dstack, tmp_path, url, [gpu, h1])
            assert seen == expected({gpu: "idle", h1: "idle"})

        # a host that does not answer is unreachable, with why (a refused connection)
        ssh_hosts.stop("h1")
        try:
            hosts = listed(dstack)
        finally:
            ssh_hosts.start("h1")
        assert hosts[h1]["status"] == "unreachable" and "refused" in hosts[h1]["problem"]
        assert hosts[gpu]["status"] == "idle"
    finally:
        destroyed = dstack("destroy", "-y")
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agents_running(remote) == set()


def test_another_project_s_job_makes_the_owner_s_host_busy(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    """The platform project runs nothing itself; ml runs on the fleet platform exports to it.
    Both see the host busy, and platform's watch counts it busy too."""
    platform, ml = tmp_path / "platform", tmp_path / "ml"
    platform.mkdir()
    ml.mkdir()
    gpu = ssh_hosts["gpu"].address
    (platform / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "gpu", "gpu"))
    _ok(dstack("apply", "-y", cwd=platform))
    try:
        _ok(
            dstack("export", "create", "share", "--fleet", "gpu", "--importer",
                   f"ml={ml}/.dstack/state.json", cwd=platform)
        )  # fmt: skip
        _projects_file(ml, platform, ssh_hosts.client_key)
        assert listed(dstack, platform)[gpu]["status"] == "idle"
        assert listed(dstack, ml)[gpu]["status"] == "idle"

        (ml / "train.dstack.yml").write_text(_task("train", "[platform/gpu]"))
        _ok(dstack("apply", "-y", cwd=ml))
        assert _rows(dstack, ml)["task.train"]["status"] == "running"

        assert listed(dstack, platform)[gpu]["status"] == "busy"
        assert listed(dstack, ml)[gpu]["status"] == "busy"
        assert instances(dstack, tmp_path, cwd=platform) == {"busy": 1}
        _ok(dstack("destroy", "-y", cwd=ml))
        assert listed(dstack, platform)[gpu]["status"] == "idle"
    finally:
        dstack("destroy", "-y", cwd=ml)
        destroyed = dstack("destroy", "-y", cwd=platform)
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agents_running(remote) == set()
