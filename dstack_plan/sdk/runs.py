"""`Run`: a handle on a run in a project's state: its status, jobs and logs as `dstack ps`
and `dstack logs` read them, waiting for it to end, stopping it. Every method has an async
twin (`astatus`, `alogs`, `await_end`, `astop`) for async code; the plain ones work in
Jupyter too, where an event loop already runs."""

from __future__ import annotations

import asyncio
import io
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.sdk.loop import run_sync

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from dstack_plan.inspect.runs import JobView, RunView
    from dstack_plan.project import Project

POLL_SECONDS = 0.5


@asynccontextmanager
async def opened(directory: Path) -> AsyncIterator[Project]:
    """The project at `directory`, its connections closed after."""
    from dstack_plan.project import Project

    project = Project(directory)
    try:
        yield project
    finally:
        await project.close()


@dataclass(frozen=True)
class Run:
    """A run of the project at `directory`, by its state address (`task.train`)."""

    directory: Path
    address: str

    @property
    def name(self) -> str:
        return self.address.split(".", 1)[1]

    # -- reading ----------------------------------------------------------------------

    async def aview(self) -> RunView:
        """The run as `dstack ps --json` shows it, asked of its agents now."""
        from dstack_plan.inspect.runs import list_runs

        async with opened(self.directory) as project:
            views = await list_runs(project, all_runs=True, addresses={self.address})
        if not views:
            raise LookupError(f"{self.address} is not in the state of {self.directory}")
        return views[0]

    def view(self) -> RunView:
        return run_sync(self.aview())

    async def astatus(self) -> str:
        return (await self.aview()).status

    def status(self) -> str:
        """`submitted`, `running`, `done`, `failed`, `terminated`, ..."""
        return run_sync(self.astatus())

    @property
    def jobs(self) -> list[JobView]:
        """The run's jobs now: id, status, exit code, host, GPUs, ports."""
        return list(self.view().jobs)

    async def alogs(self, follow: bool = False, *, replica: int = 0, job: int = 0) -> str:
        """One job's log so far (replica 0, job 0 unless told); with `follow`, also printed
        as it comes, until the job ends."""
        from dstack_plan.inspect.logs import write_logs

        out = _Tee(sys.stdout) if follow else io.BytesIO()
        async with opened(self.directory) as project:
            await write_logs(project, self.name, out, replica=replica, job=job, follow=follow)
        return out.getvalue().decode(errors="replace")

    def logs(self, follow: bool = False, *, replica: int = 0, job: int = 0) -> str:
        return run_sync(self.alogs(follow, replica=replica, job=job))

    # -- waiting and stopping ---------------------------------------------------------

    async def await_end(self, timeout: float | None = None) -> str:
        """Wait until the run ends; its final status. TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = await self.astatus()
            if status in FINISHED_STATUSES:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.address} is still {status} after {timeout:g}s")
            await asyncio.sleep(POLL_SECONDS)

    def wait(self, timeout: float | None = None) -> str:
        return run_sync(self.await_end(timeout))

    async def astop(self, abort: bool = False) -> str:
        """Stop the run's jobs (gracefully within `stop_duration`, or `abort` at once) and
        wait until they ended; the run's status then."""
        from dstack_plan.inspect.stop import stop_run

        async with opened(self.directory) as project:
            result = await stop_run(project, self.name, abort=abort)
        return result.status

    def stop(self, abort: bool = False) -> str:
        return run_sync(self.astop(abort))

    def _repr_html_(self) -> str:
        from dstack_plan.sdk.html import run_table

        return run_table(self.view())


class _Tee(io.BytesIO):
    """Kept, and also written to a text stream (a notebook's output) as it arrives."""

    def __init__(self, echo: TextIO) -> None:
        super().__init__()
        self._echo = echo

    def write(self, data: ReadableBuffer) -> int:
        self._echo.write(bytes(data).decode(errors="replace"))
        self._echo.flush()
        return super().write(data)
