"""A plan's lines for runs it leaves as they are: one a line while they are few, summed up by
fleet when there are many (a no-op plan of 10,000 runs is a few lines, as Terraform's is),
and those waiting for room always named."""

from __future__ import annotations

from dstack_plan.cli.output import plain_text
from dstack_plan.plan.model import Action, Placement, Plan, ResourceChange
from dstack_plan.plan.render import NOOP_LINES, render_plan


def kept(i: int, placement: Placement) -> ResourceChange:
    return ResourceChange(f"task.t{i}", "task", f"t{i}", "local", Action.NOOP, placement=placement)


def shown(changes: list[ResourceChange]) -> list[str]:
    plan = Plan(lineage="l", serial=1, changes=tuple(changes))
    return [plain_text(line) for line in render_plan(plan)]


def test_few_unchanged_runs_are_listed_one_a_line() -> None:
    here = Placement(fleet="local", provider="local", hosts=("vm",), placed=True)
    lines = shown([kept(i, here) for i in range(NOOP_LINES)])
    assert lines[0].startswith("No changes.")
    assert lines[1:-1] == [
        f"  task.t{i}: no changes (fleet local (local) on vm, $0.00/h)" for i in range(NOOP_LINES)
    ]


def test_many_unchanged_runs_are_summed_up_by_fleet_naming_those_that_wait() -> None:
    here = Placement(fleet="local", provider="local", hosts=("vm",), placed=True)
    changes = [kept(i, here) for i in range(9_000)]
    hosts = [f"10.0.0.{h}" for h in range(50)]
    changes += [
        kept(
            9_000 + i,
            Placement(
                fleet="gpus",
                provider="ssh",
                hosts=(hosts[i % 50],),
                price_per_hour=0.5,
                placed=True,
            ),
        )
        for i in range(999)
    ]
    waiting = Placement(
        fleet="gpus",
        provider="ssh",
        placed=False,
        pending=True,
        note="waits for 1 GPU held by task.t9000",
    )
    changes.append(kept(9_999, waiting))
    lines = shown(changes)
    assert lines == [
        "No changes. Your infrastructure matches the configuration.",
        "  task.t9999: no changes (fleet gpus (ssh), $0.00/h — waits for 1 GPU held by "
        "task.t9000)",
        "  10,000 runs without changes (where each one is: `dstack plan --json`):",
        "    fleet local (local): 9,000 on vm, $0.00/h",
        "    fleet gpus (ssh): 1,000 on 50 hosts, $499.50/h",
        "",
    ]


def test_the_note_on_submitted_resources_now_declared_reads_right_in_both_numbers() -> None:
    def declared(*names: str) -> list[str]:
        changes = [
            ResourceChange(f"task.{n}", "task", n, "local", Action.NOOP, submitted=False)
            for n in names
        ]
        return [line for line in shown(changes) if "now declared by the files" in line]

    assert declared("a") == [
        "1 submitted resource now declared by the files (deleting it from them later "
        "destroys it): task.a"
    ]
    assert declared("a", "b") == [
        "2 submitted resources now declared by the files (deleting one from them later "
        "destroys it): task.a, task.b"
    ]
