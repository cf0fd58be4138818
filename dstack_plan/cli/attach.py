"""Attaching to runs (`dstack attach`, `apply --attach`): their ports forwarded to this
machine and their logs on stdout, until they end or Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.inspect.dev_ssh import DevAccess
    from dstack_plan.inspect.ports import PortOverride, RunPorts
    from dstack_plan.plan.lines import Line
    from dstack_plan.project import Project
    from dstack_plan.state.model import ResourceState


async def attach_runs(
    project: Project,
    addresses: list[str],
    *,
    ports: Sequence[PortOverride] = (),
    logs: bool = True,
    explain: bool = False,
) -> bool:
    """Forward the ports of the runs at `addresses` (as state records them) to 127.0.0.1
    here, print their URLs, and stream the jobs' logs (to nowhere without `logs`).

    Tasks are followed until all their jobs end; True only if every job ended `done` with
    exit code 0. Services and dev environments never end: Ctrl-C detaches (the jobs keep
    running, the forwards close) and counts as success unless a job already failed. While
    attached, dev environments are touched every 30 s (`inspect.activity`), so watch does
    not stop them for `inactivity_duration`. A dev environment first gets its `Host <run>`
    SSH entry (`inspect.dev_ssh`): `ssh <run>` and the `ide:` link are printed.
    `explain` also says so when a run has no port to forward.
    """
    from dstack_plan.apply.interrupt import Interrupt
    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.activity import keep_touching
    from dstack_plan.inspect.dev_ssh import attach_dev_environments
    from dstack_plan.inspect.ports import forward_ports
    from dstack_plan.inspect.stream import attached_runs, stream_runs
    from dstack_plan.plan.lines import styled

    runs = attached_runs(project, addresses)
    if not runs:
        return True
    names = ", ".join(r.address for r in runs)
    stop = asyncio.Event()
    interrupt = Interrupt()
    interrupt.subscribe(lambda count: stop.set())
    with interrupt.signal_handlers():
        print_lines(ssh_lines(await attach_dev_environments(project, runs, stop=stop)))
        async with forward_ports(project, runs, ports, stop=stop) as opened:
            print_lines(port_lines(opened, runs, explain))
            what = "Attached to" if logs else "Forwarding the ports of"
            note = f"{what} {names}; Ctrl-C detaches, the jobs keep running."
            print_lines([(styled(note, "dim"),)], True)
            sys.stdout.flush()  # rich wrote text through sys.stdout; logs go to its buffer
            # being attached is activity of a dev environment (its inactivity_duration)
            touching = asyncio.create_task(keep_touching(project, runs))
            try:
                if logs:
                    result = await stream_runs(project, runs, sys.stdout.buffer, stop)
                else:
                    with open(os.devnull, "wb") as nowhere:  # followed: to know they ended
                        result = await stream_runs(project, runs, nowhere, stop)
            finally:
                touching.cancel()
                await asyncio.gather(touching, return_exceptions=True)
    for job_id in result.failed:
        info = result.finished[job_id]
        code = f" (exit code {info.exit_code})" if info.exit_code is not None else ""
        why = f": {info.termination_message}" if info.termination_message else ""
        print_lines([(styled(f"{job_id}: {info.status.value}{code}{why}", "red"),)], True)
    if result.detached:
        print_lines([f"Detached from {names}; stop with: dstack stop <run> (see dstack ps)"], True)
    return not result.failed


def ssh_lines(accesses: Sequence[DevAccess | DstackPlanError]) -> list[Line]:
    """`SSH: ssh dev` and `Open in VS Code: vscode://...` per dev environment, or why its
    SSH entry could not be written."""
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.plan.lines import styled

    lines: list[Line] = []
    for access in accesses:
        if isinstance(access, DstackPlanError):
            lines.append((styled(f"No SSH: {access}", "yellow"),))
            continue
        lines.append(f"SSH: {access.ssh_command}")
        if access.ide_link is not None:
            lines.append(f"Open in {access.ide_name}: {access.ide_link}")
    return lines


def port_lines(opened: RunPorts, runs: list[ResourceState], explain: bool) -> list[Line]:
    """`Forwarding: http://127.0.0.1:8000 -> web-0-0-... host:8000` per port (`Listening:`
    for a job on this machine, reached without a forward), then what could not be opened."""
    from dstack_plan.plan.lines import styled

    lines: list[Line] = []
    for port in opened.ports:
        where = f"{port.url} -> {port.job} {port.host}:{port.container_port}"
        if port.forwarded:
            lines.append(f"Forwarding: {where}")
        else:
            lines.append(f"Listening: {where} (on this machine, nothing forwarded)")
    lines += [(styled(str(port), "yellow"),) for port in opened.unknown]
    if explain:
        with_ports = {p.run for p in opened.ports} | {p.run for p in opened.unknown}
        lines += [
            f"{run.address} has no ports to forward."
            for run in runs
            if run.address not in with_ports
        ]
    return lines
