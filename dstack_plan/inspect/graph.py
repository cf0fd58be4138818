"""The dependency graph of a project as DOT: from its configuration, or from state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstack_plan.graph import dag
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.project import Project


def state_edges(state: State) -> dict[str, tuple[str, ...]]:
    """address -> dependencies as recorded in state (those still in it)."""
    present = set(state.resources)
    return {
        address: tuple(d for d in resource.depends_on if d in present)
        for address, resource in state.resources.items()
    }


def project_edges(project: Project) -> dict[str, tuple[str, ...]]:
    """address -> dependencies of the declared resources; when nothing is declared (the
    configuration is gone), as recorded in state, which destroy follows."""
    from dstack_plan.graph.references import dependencies

    desired = project.load()
    if len(desired):
        return dict(dependencies(desired, project.directory))
    return state_edges(project.backend.read().state)


def project_dot(project: Project) -> str:
    """DOT of `project_edges`."""
    return dag.to_dot(dag.build(project_edges(project)))


def project_graph_json(project: Project) -> list[dict[str, object]]:
    """`project_edges` as `[{address, depends_on: [...]}]`, by address."""
    edges = project_edges(project)
    return [{"address": a, "depends_on": sorted(edges[a])} for a in sorted(edges)]
