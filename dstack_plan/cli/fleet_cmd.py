"""`dstack fleet ...`: work with the fleets a project declares."""

from __future__ import annotations

from pathlib import Path

import typer

from dstack_plan.cli import common

app = typer.Typer(
    name="fleet",
    help="Work with fleets (list, add-host, trust, probe); alone, as `dstack fleet list`.",
    add_completion=False,
    rich_markup_mode=None,
)

HEADERS = ["FLEET", "HOST", "STATUS", "GPUS", "CPUS", "MEMORY", "DISK", "AGENT"]
NO_FLEETS = (
    "No fleets. Runs without `fleets:` go to the built-in `local` fleet (this machine; "
    "`dstack offer` lists it)."
)
ListDirOpt = typer.Option(Path("."), "--dir", help="Project directory.")
RefreshOpt = typer.Option(False, "--refresh", help="Ask every host now (state is not written).")


@app.callback(invoke_without_command=True)
def bare(
    ctx: typer.Context,
    directory: Path = ListDirOpt,
    state: str = common.StateOpt,
    refresh: bool = RefreshOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """`dstack fleet [--json] ...` alone is `dstack fleet list`, as in dstack."""
    common.run_bare_group(ctx, lambda: list_(None, directory, state, refresh, as_json))


@app.command("list")
def list_(
    name: str | None = typer.Argument(None, help="Only this fleet (the NAME of fleet.NAME)."),
    directory: Path = ListDirOpt,
    state: str = common.StateOpt,
    refresh: bool = RefreshOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """The hosts of the fleets in state: status, GPUs, CPUs, memory, disk, agent version;
    then those of the fleets other projects export to this one (`owner/name`, from the
    owner's state; --json gives their `owner`).

    AGENT also says how the agent runs: `systemd` (an enabled unit: it comes back after a
    reboot) or `detached` (it does not; the next command that needs it starts it again).

    From the state the last apply wrote; `--refresh` asks each host first (a host that does
    not answer is shown `unreachable` with the reason).

    STATUS is dstack's instance status: `busy` while a job runs on the host (of any project),
    `idle` when none does (each agent is asked now, as `dstack top` does; no agent is
    started), `unreachable` when its agent does not answer (or did not at its last check),
    `pending`/`provisioning`/`terminating`/`terminated` while it is set up or torn down.
    """
    from dstack_plan.cli.output import print_json, print_lines
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.inspect.fleets import (
        ask_hosts,
        fleet_records,
        fleets_json,
        host_rows,
        imported_records,
        reboot_note,
    )
    from dstack_plan.sharing.imports import is_imported

    project = common.make_project(directory, [], state)

    async def listed(p):  # noqa: ANN001, ANN202 - Project, imported lazily
        current = (await p.refresh()).state if refresh else p.backend.read().state
        if name is not None and is_imported(name):
            shared = imported_records(p.imports)
            if name not in shared:
                known = ", ".join(shared) or "none"
                raise DstackPlanError(
                    f"no fleet {name!r} exported to this project (imported: {known})"
                )
            records = {name: shared[name]}
        else:
            records = fleet_records(current, name)
            if name is None:  # then the fleets other projects export to this one
                records |= imported_records(p.imports)
        p.machines.start_agents = False  # a listing only asks the agents that run
        return records, await ask_hosts(p.machines, current, records)

    records, answers = common.run_with(project, listed)
    if as_json:
        print_json(fleets_json(records, answers))
        return
    if not records:
        print_lines([NO_FLEETS])  # (a fleet asked for by name and missing is an error)
        return
    rows = [HEADERS, *host_rows(records, answers)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    note = reboot_note(records)
    print_lines([line.rstrip() for line in lines] + ([note] if note else []))


@app.command("add-host")
def add_host(
    fleet: str = typer.Argument(..., help="Fleet name (the NAME of fleet.NAME)."),
    url: str = typer.Argument(..., help="The host: ssh://USER@HOST[:PORT]."),
    files: list[str] = typer.Option(
        [], "-f", "--file", help="The file declaring the fleet (default: search the project)."
    ),
    identity_file: str = typer.Option(
        None, "--identity-file", help="Private key for this host, when not ssh_config's."
    ),
    directory: Path = typer.Option(Path("."), "--dir", help="Project directory."),
) -> None:
    """Add a host to an SSH fleet's ssh_config.hosts, editing its YAML in place.

    Only the new entry is written: comments, blank lines and layout stay as they were. The
    user, port and identity file are written on the host only when they differ from
    ssh_config's; a URL without a port takes the fleet's port. The next `dstack plan` shows
    the new host as an in-place update of the fleet.
    """
    from dstack_plan.cli.common import require_directory
    from dstack_plan.cli.output import print_lines
    from dstack_plan.config.add_host import add_host as add
    from dstack_plan.plan.diff import diff_specs
    from dstack_plan.plan.lines import styled

    require_directory(directory)
    added = add(directory, files, fleet, url, identity_file)
    diff = diff_specs("fleet", added.before.normalized, added.after.normalized)
    how = "replaced" if diff.forces_replacement else "updated in-place"
    fields = ", ".join(f"{k}: {v}" for k, v in added.entry.items())
    print_lines(
        [
            f"Added {{{fields}}} to {added.after.address} in {added.file}.",
            (
                "The next plan shows ",
                styled(added.after.address, "bold"),
                f" {how} (changed: {', '.join(diff.changed)}).",
            ),
        ]
    )


@app.command("trust")
def trust(
    fleet: str = typer.Argument(..., help="Fleet name (the NAME of fleet.NAME)."),
    host: str = typer.Argument(..., help="The host as `dstack fleet list` names it."),
    directory: Path = typer.Option(Path("."), "--dir", help="Project directory."),
    state: str = common.StateOpt,
) -> None:
    """Forget a host's pinned host key and pin the one it presents now.

    For a host that was reinstalled (its key changed on purpose). The fleet's hosts are asked
    again at once, so the new key is recorded in state before any other command uses it.
    """
    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.fleets import trust_host

    project = common.make_project(directory, [], state)

    async def work(p):  # noqa: ANN001, ANN202 - Project, imported lazily
        return await trust_host(p.backend, fleet, host, p.handlers()["fleet"], p.context())

    forgotten, now = common.run_with(project, work)
    lines = [f"Forgot the pinned key {forgotten or '(none)'} of {host} in fleet.{fleet}."]
    if now.problem:
        lines.append(f"The host did not answer: {now.problem}")
        print_lines(lines)
        raise typer.Exit(1)
    lines.append(f"Pinned its key {now.host_key_fingerprint}.")
    print_lines(lines)


@app.command("probe")
def probe(
    fleet: str = typer.Argument(..., help="Fleet name (the NAME of fleet.NAME)."),
    seconds: float = typer.Option(1.0, "--seconds", help="How long each pair sends (at most 5)."),
    parallelism: int = typer.Option(
        4, "--parallelism", help="Most pairs probed at once (never two with the same host)."
    ),
    directory: Path = typer.Option(Path("."), "--dir", help="Project directory."),
    state: str = common.StateOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """Measure the TCP bandwidth between every pair of the fleet's hosts; record it in state.

    The hosts' agents talk to each other directly: one listens on its fleet address, the other
    sends to it for about a second. A pair that fails is recorded `unknown` with the reason
    (the command still succeeds). `dstack fleet list --json` shows the matrix; the gang choice
    (`scheduler/bandwidth.py`) reads it; `dstack watch` exports it as a metric.
    """
    from dstack_plan.cli.output import print_json, print_lines
    from dstack_plan.fleets.probe import link_rows, probe_fleet, record_bandwidth

    project = common.make_project(directory, [], state)

    async def work(p):  # noqa: ANN001, ANN202 - Project, imported lazily
        current = p.backend.read().state
        machines = await p.machines.machines(fleet, current)
        if len(machines) < 2:
            return len(machines), None
        record = await probe_fleet(
            p.machines, fleet, current, p.clock, seconds=seconds, parallelism=parallelism
        )
        await record_bandwidth(p.backend, fleet, record, p.clock)
        return len(machines), record

    count, record = common.run_with(project, work)
    if as_json:
        data = record.model_dump(mode="json") if record is not None else None
        print_json({"fleet": fleet, "hosts": count, "bandwidth": data})
        return
    if record is None:
        print_lines([f"fleet.{fleet} has {count} host(s): no pair to probe."])
        return
    rows = [["SRC", "DST", "BANDWIDTH", "PROBLEM"], *link_rows(record)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    when = record.measured_at.strftime("%Y-%m-%d %H:%M:%S")
    print_lines(
        [line.rstrip() for line in lines] + [f"Recorded in fleet.{fleet} (measured {when} UTC)."]
    )
