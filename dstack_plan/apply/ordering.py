"""In which order a plan's changes may run: which must succeed first, which must just finish.

- Creates, updates, replaces and no-ops wait for the changes of what they depend on.
- Deletes run in reverse: an object is destroyed only after the objects that depend on it
  (edges recorded in state) have been destroyed, whether by a delete or by a replace.
  Likewise a replace destroys its old object only after the deletes of its dependents.
- Pure deletes go first: every other change waits until all of them have finished, except
  those a delete itself waits for (which would otherwise deadlock).

A replace is one unit (delete-then-create or create-then-delete inside one node), so two
replaces where one depends on the other simply run in forward order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dstack_plan.graph import dag
from dstack_plan.plan.model import Action, Plan, ResourceChange
from dstack_plan.state.model import State


@dataclass(frozen=True)
class Schedule:
    """Prerequisites of every change of a plan, keyed by address."""

    order: tuple[str, ...]
    """Start priority among ready changes: deletes (dependents first), then plan order."""
    dependencies: Mapping[str, frozenset[str]]
    """Must have succeeded first: what the change's new object depends on."""
    dependents: Mapping[str, frozenset[str]]
    """Must have succeeded first: dependents whose old objects are destroyed before this one."""
    deletes: frozenset[str]
    gated: frozenset[str]
    """Wait until every pure delete has finished (succeeded or not)."""

    def requires(self, address: str) -> frozenset[str]:
        """Everything that must succeed before `address` may start."""
        return self.dependencies[address] | self.dependents[address]


def _old_dependencies(change: ResourceChange, state: State) -> tuple[str, ...]:
    if change.action is Action.DELETE:
        return change.depends_on  # the planner copies them from state for a delete
    current = state.get(change.address)
    return current.depends_on if current is not None else ()


def schedule(plan: Plan, state: State) -> Schedule:
    """The schedule of `plan`, using `state` for the old edges of replaced resources.

    Raises PlanError if the prerequisites form a cycle (they cannot for a plan made from an
    acyclic configuration and state).
    """
    changes = {c.address: c for c in plan.changes}
    deletes = frozenset(a for a, c in changes.items() if c.action is Action.DELETE)
    replaces = frozenset(a for a, c in changes.items() if c.action.is_replace)
    forward = [c.address for c in plan.changes if c.address not in deletes]

    dependencies = {
        a: frozenset(
            d for d in changes[a].depends_on if d != a and d in changes and d not in deletes
        )
        for a in forward
    }
    dependencies.update({a: frozenset() for a in deletes})

    waiting: dict[str, set[str]] = {a: set() for a in changes}
    for dependent in deletes | replaces:
        for dependency in _old_dependencies(changes[dependent], state):
            if dependency == dependent or dependency not in deletes | replaces:
                continue
            if dependency in replaces and dependent in replaces:
                continue  # both are single units: forward order decides
            waiting[dependency].add(dependent)
    dependents = {a: frozenset(w) for a, w in waiting.items()}

    graph = dag.build({a: dependencies[a] | dependents[a] for a in changes})
    before_deletes = dag.with_dependencies(graph, deletes)
    gated = frozenset(a for a in forward if a not in before_deletes) if deletes else frozenset()

    delete_order = [c.address for c in reversed(plan.changes) if c.address in deletes]
    return Schedule(
        order=tuple(delete_order + forward),
        dependencies=dependencies,
        dependents=dependents,
        deletes=deletes,
        gated=gated,
    )
