"""Attaching to runs after `apply --attach`: their logs on stdout until they end or Ctrl-C."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstack_plan.project import Project


async def attach_runs(project: Project, addresses: list[str]) -> bool:
    """Stream the logs of the jobs of the runs at `addresses` (as state records them).

    Tasks are followed until all their jobs end; True only if every job ended `done` with
    exit code 0. Services and dev environments never end: Ctrl-C detaches (the jobs keep
    running) and counts as success unless a job already failed.
    """
    from dstack_plan.apply.interrupt import Interrupt
    from dstack_plan.cli.output import print_lines, styled
    from dstack_plan.inspect.stream import attached_runs, stream_runs

    runs = attached_runs(project, addresses)
    if not runs:
        return True
    names = ", ".join(r.address for r in runs)
    note = f"Attached to {names}; Ctrl-C detaches, the jobs keep running."
    print_lines([(styled(note, "dim"),)], True)
    stop = asyncio.Event()
    interrupt = Interrupt()
    interrupt.subscribe(lambda count: stop.set())
    sys.stdout.flush()  # rich wrote text through sys.stdout; logs go to its buffer below
    with interrupt.signal_handlers():
        result = await stream_runs(project, runs, sys.stdout.buffer, stop)
    for job_id in result.failed:
        info = result.finished[job_id]
        code = f" (exit code {info.exit_code})" if info.exit_code is not None else ""
        why = f": {info.termination_message}" if info.termination_message else ""
        print_lines([(styled(f"{job_id}: {info.status.value}{code}{why}", "red"),)], True)
    if result.detached:
        print_lines([f"Detached from {names}; stop with: dstack stop <run> (see dstack ps)"], True)
    return not result.failed
