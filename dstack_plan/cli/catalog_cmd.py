"""`dstack catalog ...`: the price lists cloud offers come from."""

from __future__ import annotations

from pathlib import Path

import typer

from dstack_plan.cli import common

app = typer.Typer(
    name="catalog",
    help="The cloud offer catalogues (refresh).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@app.command("refresh")
def refresh(
    directory: Path = common.DirArg,
    backend: str = typer.Option(
        None, "--backend", help="Only this backend of .dstack/backends.yml (aws, gcp, azure)."
    ),
    region: list[str] = typer.Option(
        [], "--region", help="Only these regions (repeatable); default: the catalogue's."
    ),
    as_json: bool = common.JsonOpt,
) -> None:
    """Price the catalogue of each configured cloud backend from its pricing APIs.

    AWS needs credentials (the Price List API and EC2's spot price history); Azure reads the
    public Retail Prices API; GCP composes each type's price from the Cloud Billing Catalog
    API's core, memory and GPU SKUs (with the backend's credentials).
    The catalogue's machine types stay; each (type, region) the APIs price gets today's
    on-demand and spot price, the others keep theirs. The result goes to
    .dstack/catalog/PROVIDER.json, which plans and `dstack offer` then read instead of the
    catalogue shipped with dstack-plan: commit it so the team plans with the same prices,
    delete it to go back to the shipped one. --json gives {refreshed: [{provider, path,
    priced, kept}], notes}. Exits 1 when nothing could be refreshed.
    """
    import asyncio

    from dstack_plan.cli.output import print_json, print_lines
    from dstack_plan.providers.catalog.refresh import refresh_project

    common.require_directory(directory)
    done, notes = asyncio.run(refresh_project(directory, backend=backend, regions=region or None))
    if as_json:
        print_json(
            {
                "refreshed": [
                    {
                        "provider": r.provider,
                        "path": str(r.path),
                        "priced": r.priced,
                        "kept": r.kept,
                    }
                    for r in done
                ],
                "notes": notes,
            }
        )
    else:
        lines = [
            f"{r.provider}: {r.priced} prices refreshed, {len(r.kept)} kept "
            f"-> {r.path.relative_to(directory) if r.path.is_relative_to(directory) else r.path}"
            for r in done
        ]
        print_lines([*lines, *notes])
    if not done:
        raise typer.Exit(1)
