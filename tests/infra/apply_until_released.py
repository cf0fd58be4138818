"""A child process for the Ctrl-C tests and benchmark: an apply of four creates, two at a time,
with the engine's signal handlers installed as the CLI installs them. Each create waits until
the file RELEASE exists (never, if nobody makes it).

    python tests/infra/apply_until_released.py STATE REPORT RELEASE
"""

import asyncio
import os
import sys

from dstack_plan.apply.engine import apply_plan
from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
from dstack_plan.apply.interrupt import Interrupt
from dstack_plan.plan.model import Action, Plan, ResourceChange
from dstack_plan.state import LocalBackend

state_path, report_path, release = sys.argv[1], sys.argv[2], sys.argv[3]


class Sleepy(ResourceHandler):
    async def create(self, change, ctx):
        print("started", change.address, flush=True)
        while not os.path.exists(release):
            await asyncio.sleep(0.01)
        return Outcome(status="running", attributes={"released": True})

    async def update(self, change, current, ctx):
        raise NotImplementedError

    async def delete(self, current, ctx):
        return None


def change(name):
    return ResourceChange(
        address=f"task.{name}",
        kind="task",
        name=name,
        provider="local",
        action=Action.CREATE,
        after={"name": name},
    )


async def main():
    plan = Plan(lineage="", serial=0, changes=tuple(change(n) for n in "abcd"))
    interrupt = Interrupt()

    def events(address, phase, message):
        print("event", phase, address, message, flush=True)

    with interrupt.signal_handlers():
        report = await apply_plan(
            plan,
            LocalBackend(state_path),
            {"task": Sleepy()},
            ApplyContext(),
            parallelism=2,
            interrupt=interrupt,
            on_event=events,
        )
    with open(report_path, "w") as f:
        f.write(report.model_dump_json())
    print(report.summary(), flush=True)
    return 0 if report.ok else 3


sys.exit(asyncio.run(main()))
