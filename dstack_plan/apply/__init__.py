"""The apply engine: a plan's changes made real, in dependency order, with state committed
after each one. It knows no resource kind; each kind's package supplies a handler.

- `engine`: `apply_plan(plan, handlers, ...)` walks the changes with bounded parallelism
- `ordering`: which change waits for which; `operations`: one change, and its commits
- `records`: the state entries written around an operation (intents, deposed objects)
- `handlers`: `ResourceHandler`, `ApplyContext`, `Outcome`: what a kind's package implements
- `report`, `events`, `interrupt`: what apply did, its progress, and Ctrl-C
- `deployment`: the key of a project's state, which jobs on shared agents carry
"""
