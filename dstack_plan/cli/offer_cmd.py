"""`dstack offer`: the machines that match given resources, cheapest first, with availability."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.config.resources import ResourcesSpec
    from dstack_plan.inspect.offer_rows import OfferRow, OfferView

UNMATCHED_SHOWN = 10
"""Machines that do not match listed in the table (--json lists every one)."""
_STYLE = {"idle": "green", "available": "green", "busy": "yellow", "unreachable": "red"}


def offer(
    directory: Path = common.DirArg,
    gpu: str = typer.Option(None, "--gpu", help="GPU spec, as `gpu:` takes it (A100:80GB:2)."),
    cpu: str = typer.Option(None, "--cpu", help="CPU count range, optionally with arch (8..)."),
    memory: str = typer.Option(None, "--memory", help="Memory range (64GB..)."),
    disk: str = typer.Option(None, "--disk", help="Disk size range (100GB..)."),
    backend: str = typer.Option(
        None,
        "--backend",
        help="Only the offers of this backend of .dstack/backends.yml (aws; slurm, kubernetes: "
        "those fleets' partitions or node groups), no hosts.",
    ),
    state: str = common.StateOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """List the machines a job with these resources could run on, cheapest first.

    The machines are this one (fleet `local`), the hosts of every SSH fleet in state, the
    partitions of every Slurm fleet in state (one row each: what one node has, how many are
    idle) and the offers of the cloud backends .dstack/backends.yml configures (instance
    types from the catalogue shipped with dstack-plan, in the regions the backend offers
    them, on-demand and spot); --backend lists one backend's offers only. Resources not
    given take the defaults a run without `resources:` gets (cpu=2.. mem=8GB.. disk=100GB..).
    A fleet's host matches when it can give the lower bounds (it is shared); AVAILABILITY
    says idle, available (jobs run there, the GPUs asked for are free) or busy, with what
    runs there. Machines that do not match are listed below the table, with why. --json
    gives {requirements, offers: [{fleet, provider, host, region, cpus, memory_gb, disk_gb,
    gpus: [{name, memory_mib}], price_per_hour, availability, free_gpus, held_by, error}],
    unmatched: [{fleet, host, reason}], notes}. Nothing is written to state.
    """
    from dstack_plan.cli.output import print_json, print_table
    from dstack_plan.inspect.offers import list_offers

    requirements = _requirements(gpu=gpu, cpu=cpu, memory=memory, disk=disk)
    project = common.make_project(directory, [], state)
    view = common.run_with(project, lambda p: list_offers(p, requirements, backend))
    if as_json:
        print_json(view.model_dump(mode="json"))
        return
    print_table(_render(view))


def _requirements(**flags: str | None) -> ResourcesSpec:
    """The resources the flags give; DstackPlanError naming the flag of a bad value."""
    from pydantic import ValidationError

    from dstack_plan.config.resources import ResourcesSpec
    from dstack_plan.errors import DstackPlanError

    given = {key: value for key, value in flags.items() if value is not None}
    for key, value in given.items():
        try:
            ResourcesSpec.model_validate({key: value})
        except ValidationError as e:
            messages = (str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
            message = "; ".join(messages)
            raise DstackPlanError(f"--{key} {value!r}: {message}") from None
    return ResourcesSpec.model_validate(given)


def _render(view: OfferView) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"Machines for {view.requirements}")]
    if view.offers:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("#", "FLEET", "HOST", "RESOURCES", "PRICE", "AVAILABILITY"):
            # AVAILABILITY wraps between its words (output.whole_rows); the rest stay whole
            table.add_column(column, no_wrap=column != "AVAILABILITY")
        for number, row in enumerate(view.offers, 1):
            table.add_row(
                str(number),
                row.fleet or f"{row.provider} {row.region}",
                row.host,
                _resources(row),
                f"${row.price_per_hour:g}",
                Text(_availability(row), style=_STYLE.get(row.availability, "")),
            )
        parts.append(table)
    else:
        parts.append(Text("No machine matches."))
    if view.unmatched:
        parts.append(Text(f"Not matching ({len(view.unmatched)}):"))
        # a cloud catalogue has dozens of types per region: the table shows the first ones
        shown = (
            view.unmatched
            if len(view.unmatched) <= UNMATCHED_SHOWN + 2
            else (view.unmatched[:UNMATCHED_SHOWN])
        )
        for miss in shown:
            where = f"{miss.fleet} ({miss.host})" if miss.fleet and miss.host else miss.host
            parts.append(Text(f"  {where or miss.fleet}: {miss.reason}"))
        if len(shown) < len(view.unmatched):
            parts.append(Text(f"  ... {len(view.unmatched) - len(shown)} more (--json lists all)"))
    parts += [Text(f"Note: {note}") for note in view.notes]
    return Group(*parts)


def _resources(row: OfferRow) -> str:
    text = f"cpu={row.cpus} mem={row.memory_gb:g}GB"
    if row.disk_gb:  # a Slurm partition's 0: disk is not Slurm's to grant
        text += f" disk={row.disk_gb:g}GB"
    if row.gpus:
        first = row.gpus[0]
        memory = f":{round(first.memory_mib / 1024)}GB" if first.memory_mib else ""
        text += f" gpu={first.name}{memory}:{len(row.gpus)}"
    return text


def _availability(row: OfferRow) -> str:
    if row.availability == "unreachable":
        return f"unreachable: {row.error}"
    text: str = row.availability
    if row.free_gpus is not None and row.gpus:
        text += f", {row.free_gpus} of {len(row.gpus)} GPUs free"
    if row.held_by:
        text += f" (runs {', '.join(row.held_by)})"
    return text
