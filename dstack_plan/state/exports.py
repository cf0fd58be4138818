"""What a project shares with others: its exports, kept in its state.

An export names fleets (and gateways) of this project and the importer projects that may use
them, each with where its state lives (so that the owner's watch can read, never write, the
importers' states and see their pending work). `dstack export` edits them under the state
lock; importers read them, read-only, from the owner's state (`sharing/imports.py`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Importer(BaseModel):
    """A project an export is shared with: its name and where its state lives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str
    state: str
    """Its state's location as the owner names it: a path, or an `s3://` URL."""


class Export(BaseModel):
    """One export: this project's fleets and gateways, shared with `importers`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    fleets: tuple[str, ...] = ()
    gateways: tuple[str, ...] = ()
    importers: tuple[Importer, ...] = ()

    def importer(self, project: str) -> Importer | None:
        """The importer named `project`, if this export shares with it."""
        return next((i for i in self.importers if i.project == project), None)


def exported_to(exports: dict[str, Export], kind: str, name: str, project: str) -> str | None:
    """The name of an export that shares this project's `kind` (`fleet` or `gateway`) `name`
    with `project`; None when none does."""
    for export in exports.values():
        names = export.fleets if kind == "fleet" else export.gateways
        if name in names and export.importer(project) is not None:
            return export.name
    return None
