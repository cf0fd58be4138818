"""`dstack fleet ...`: work with the fleets a project declares."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    name="fleet",
    help="Work with fleets (add-host).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


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
    from dstack_plan.cli.output import print_lines, styled
    from dstack_plan.config.add_host import add_host as add
    from dstack_plan.gcpause import resume_after_startup
    from dstack_plan.plan.diff import diff_specs

    resume_after_startup()
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
