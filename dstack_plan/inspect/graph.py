"""The dependency graph of a project: from its configuration, from state, or of a plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstack_plan.graph import dag
from dstack_plan.graph.dag import NodeInfo
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.graph.dag import Graph
    from dstack_plan.plan.model import Plan
    from dstack_plan.project import Project


def state_edges(state: State) -> dict[str, tuple[str, ...]]:
    """address -> dependencies as recorded in state (those still in it)."""
    present = set(state.resources)
    return {
        address: tuple(d for d in resource.depends_on if d in present)
        for address, resource in state.resources.items()
    }


def state_graph(state: State) -> Graph:
    """The graph recorded in state (what destroy follows), with kinds and providers."""
    info = {a: NodeInfo(r.kind, r.provider) for a, r in state.resources.items()}
    return dag.build(state_edges(state), info)


def project_graph(project: Project) -> Graph:
    """The graph of the declared resources, as plan orders them (kinds, providers, checked
    edges); when nothing is declared (the configuration is gone), the one recorded in state."""
    if not len(project.load()):
        return state_graph(project.backend.read().state)
    items = project.desired_items()
    info = {item.address: NodeInfo(item.kind, item.provider) for item in items}
    return dag.build({item.address: item.depends_on for item in items}, info)


def plan_graph(plan: Plan) -> Graph:
    """The graph of a plan's changes, each node carrying its planned action; edges are the
    dependencies among the changed addresses (from state for a delete)."""
    changes = {c.address: c for c in plan.changes}
    info = {a: NodeInfo(c.kind, c.provider, c.action.value) for a, c in changes.items()}
    edges = {a: tuple(d for d in c.depends_on if d in changes) for a, c in changes.items()}
    return dag.build(edges, info)
