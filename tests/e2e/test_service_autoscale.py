"""Request-rate autoscaling by watch's proxy, on the local fleet with a real agent and real
containers and watch's clock injected: a bounded burst of requests scales the service up
after `scale_up_delay`, quiet scales it down to zero after `scale_down_delay`, and the first
request to a service at zero waits for the replica it starts and then gets its answer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.runs.records import RunRecord
from dstack_plan.runs.scaling import ScalingRecord
from dstack_plan.state.events import EventLog
from dstack_plan.state.lease import LeaderLease, new_holder_id
from dstack_plan.state.select import open_backend
from dstack_plan.watch.actors import default_actors
from dstack_plan.watch.loop import Watcher
from dstack_plan.watch.serving import serve_services
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_service_ports import httpd_service
from tests.infra.docker_images import ensure_busybox_image

pytestmark = pytest.mark.docker

SCALING = "scaling: {metric: rps, target: 1, window: 30s, scale_up_delay: 10s, " \
    "scale_down_delay: 60s}\n"  # fmt: skip


def record(project: Path) -> tuple[ScalingRecord | None, int]:
    """The autoscaler's record of service `web` and how many replicas state holds."""
    entry = open_backend(project).read().state.resources["service.web"]
    return ScalingRecord.of(entry.attributes), len(RunRecord.of(entry).jobs)


async def eventually(
    check: Callable[[], Awaitable[bool]], step: Callable[[], Awaitable[None]]
) -> None:
    """Run `step` (a tick) until `check` holds, for at most 60 s of real time."""
    deadline = time.monotonic() + 60
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.3)
        await step()


def test_watch_scales_a_service_by_its_request_rate_and_to_zero_and_back(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, docker_client: Any
) -> None:
    image = ensure_busybox_image(docker_client)
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(httpd_service(image, replicas="0..2") + SCALING)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    row = wait_for_status(dstack, "service.web", {"running"})
    assert len(row["jobs"]) == 1  # 0..2 starts with one, as dstack does
    asyncio.run(_scale(dstack, project, agent_dir))


async def _scale(dstack: Dstack, project: Path, agent_dir: Path) -> None:
    clock = FakeClock(time.time())
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    lease = LeaderLease(watched.backend, new_holder_id(), clock=clock)
    serving = await serve_services(watched, holder=lease.holder_id)
    watcher = Watcher(
        watched, lease=lease, events=EventLog(watched.backend), actors=default_actors(serving)
    )
    token = (project / ".dstack" / "service-token").read_text().strip()
    url = f"{serving.url}/proxy/services/web/"
    auth = {"Authorization": f"Bearer {token}"}

    async def tick(seconds: float = 0.3) -> None:
        clock.advance(seconds)
        await watcher.tick()

    try:
        async with httpx.AsyncClient(headers=auth, timeout=10) as client:
            await tick()
            # a bounded burst: 60 requests in the 30 s window is 2 req/s, target 1 each
            answers = {(await client.get(url)).text.strip() for _ in range(60)}
            assert answers == {"replica-0"}
            await tick(1)
            scaling, replicas = record(project)
            assert scaling is not None and (scaling.desired, scaling.wanted) == (1, 2)
            assert scaling.held_by == "scale_up_delay" and replicas == 1
            ps = dstack("ps")
            note = " ".join(ps.stdout.split())  # the table wraps the note
            assert (
                "replicas 1: 2 req/s, target 1/replica; 2 wanted, held by scale_up_delay" in note
            ), ps.stdout

            await tick(10)  # past scale_up_delay from the service's start
            scaling, replicas = record(project)
            assert scaling is not None and scaling.desired == 2 and replicas == 2

            async def both_answer() -> bool:
                seen = {(await client.get(url)).text.strip() for _ in range(6)}
                return seen == {"replica-0", "replica-1"}

            await eventually(both_answer, tick)

            await tick(35)  # the burst left the window; scale_down_delay holds
            scaling, replicas = record(project)
            assert scaling is not None and (scaling.desired, scaling.wanted) == (2, 0)
            assert scaling.held_by == "scale_down_delay" and replicas == 2
            shown = json.loads(dstack("ps", "--json").stdout)
            assert shown[0]["scaling"]["held_by"] == "scale_down_delay"
            assert shown[0]["url"] == url

            await tick(30)  # past scale_down_delay: replicas 0..2 goes to zero
            scaling, replicas = record(project)
            assert scaling is not None and scaling.desired == 0 and replicas == 0

            # the first request waits for the replica its waiting starts
            first = asyncio.create_task(client.get(url, timeout=60))

            async def answered() -> bool:
                return first.done()

            await eventually(answered, tick)
            response = first.result()
            assert response.status_code == 200, response.text
            assert response.text.strip() == "replica-0"
            scaling, replicas = record(project)
            assert scaling is not None and scaling.desired == 1 and replicas == 1
    finally:
        await serving.close()
        await watched.close()
    assert dstack("destroy", "-y").returncode == 0
