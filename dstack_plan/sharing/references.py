"""Other projects' fleets and gateways a configuration names (`fleets: [platform/gpu]`,
`gateway: platform/gw`), resolved for `validate -f` against the projects
`.dstack/projects.yml` names: what cannot be used from here is a warning at the name, since
such a file may be meant for another project (dstack's docs are full of them); `plan`
refuses the same names as errors (`sharing/imports.py`, `gateways/served.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from dstack_plan.config.loader import issue_at
from dstack_plan.config.profile import reference_parts
from dstack_plan.config.resource import Desired
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import ConfigIssue
from dstack_plan.sharing.imports import SEPARATOR, Imports, NotImported

Path_ = tuple[str | int, ...]


def imported_reference_warnings(
    desired: Desired, imports: Imports, project_dir: str | Path = "."
) -> list[ConfigIssue]:
    """One located warning per other project's fleet or gateway that this project cannot
    use (an unknown project, an unreadable state, a name its state lacks or does not
    export to this project)."""
    warnings = []
    for resource in desired:
        spec = resource.spec
        if not isinstance(spec, RunSpec):
            continue
        for path, kind, owner, name in _references(spec):
            try:
                if kind == "fleet":
                    imports.fleet(f"{owner}{SEPARATOR}{name}", placing=True)
                else:
                    imports.gateway(owner, name)
            except NotImported as e:
                why = str(e) if str(e).startswith(kind) else f"{kind} {owner}/{name}: {e}"
                warnings.append(issue_at(resource, path, why, project_dir))
    return warnings


def _references(spec: RunSpec) -> Iterator[tuple[Path_, str, str, str]]:
    """(where, `fleet` or `gateway`, owner, name) of each other project's name in `spec`."""
    for index, fleet in enumerate(spec.fleets or ()):
        owner, name = reference_parts(fleet)
        if owner is not None:
            yield ("fleets", index), "fleet", owner, name
    gateway = getattr(spec, "gateway", None)
    if gateway is not None and not isinstance(gateway, bool):
        owner, name = reference_parts(gateway)
        if owner is not None:
            yield ("gateway",), "gateway", owner, name
