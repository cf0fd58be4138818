"""Keep the package map true: no import circles, no import that climbs a layer.

Every import of `dstack_plan` counts, wherever it is written: at module level, inside a
function, or under `TYPE_CHECKING` (a circle through type-only imports is still a circle in
the design). Exit status 1 lists each circle (its modules) and each upward import (file:line).

    python scripts/check_layers.py            # the check `make lint` runs
    python scripts/check_layers.py --graph    # every package-to-package edge, for reading

The layers, top to bottom, are in LAYERS; docs/architecture.md explains them. An import may
go down, or sideways within its layer as long as no circle forms; never up.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dstack_plan"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "cli", "web"),
    ("sdk", "inspect", "watch"),
    ("project",),
    ("policy",),
    ("runs", "fleets", "volumes", "gateways"),
    ("apply",),
    ("plan", "graph", "scheduler", "proxy"),
    ("providers", "sharing"),
    ("state", "config", "agent"),
    ("errors", "clock"),
)
"""Top-level parts of `dstack_plan` (packages or modules), from the top layer down."""

SELF_CONTAINED = ("agent",)
"""Parts that import nothing of the controller (only the bottom layer): the agent runs on
hosts alone."""

RANK = {part: depth for depth, parts in enumerate(LAYERS) for part in parts}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    path: Path
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    """The top-level part of `dstack_plan` a module belongs to (`__init__` for the root)."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def resolve(name: str, modules: set[str]) -> str | None:
    """The longest known module that `name` (a module, or a name inside one) refers to."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(path: Path, module: str, modules: set[str]) -> list[Import]:
    """Every import of a `dstack_plan` module in one file, resolved to the module imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop] if drop else anchor
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import submodule` imports the submodule, not the package
            names = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
            names = [n if n in modules else base for n in names] or [base]
        for name in names:
            if not name.startswith(PACKAGE):
                continue
            target = resolve(name, modules)
            if target and target != module:
                found.append(Import(module, target, path, node.lineno))
    return found


def collect() -> list[Import]:
    paths = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return [edge for p in paths for edge in imports_of(p, module_name(p), modules)]


def upward(edges: list[Import]) -> list[str]:
    problems = []
    for edge in edges:
        source, target = part_of(edge.source), part_of(edge.target)
        where = f"{edge.path.relative_to(ROOT)}:{edge.line}"
        if source in SELF_CONTAINED and target != source and target not in LAYERS[-1]:
            problems.append(
                f"{where}: {edge.source} imports {edge.target} ({source} stands alone)"
            )
            continue
        if source not in RANK or target not in RANK:
            unknown = source if source not in RANK else target
            problems.append(f"{where}: `{unknown}` has no layer in scripts/check_layers.py")
        elif RANK[target] < RANK[source]:
            problems.append(
                f"{where}: {edge.source} imports {edge.target} (up: {source} → {target})"
            )
    return problems


def circles(edges: list[Import]) -> list[list[str]]:
    """Circles of modules, and circles of the packages side by side in one layer (a module
    of `config` importing `state` while another of `state` imports `config`)."""
    found: list[list[str]] = []
    for name_of in (lambda m: m, part_of):
        graph = nx.DiGraph()
        graph.add_edges_from((name_of(e.source), name_of(e.target)) for e in edges)
        graph.remove_edges_from(nx.selfloop_edges(graph))
        components = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
        found += sorted(components, key=lambda c: (-len(c), c))
    return found


def _sample_edges(cycle: list[str], edges: list[Import]) -> list[tuple[Import, str]]:
    """The imports that close a circle, one per member, so the message says where to cut."""
    members = set(cycle)
    level = part_of if all("." not in m for m in cycle) else (lambda m: m)
    shown: list[tuple[Import, str]] = []
    for edge in edges:
        source, target = level(edge.source), level(edge.target)
        if source in members and target in members and source != target:
            shown.append((edge, edge.target))
    return shown if len(shown) <= 12 else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print package-level edges")
    args = parser.parse_args()
    edges = collect()
    if args.graph:
        pairs = sorted({(part_of(e.source), part_of(e.target)) for e in edges})
        for source, target in pairs:
            if source != target:
                print(f"{source} -> {target}")
        return 0
    problems = upward(edges)
    for problem in problems:
        print(problem)
    cycles = circles(edges)
    for cycle in cycles:
        for source, target in _sample_edges(cycle, edges):
            print(f"  {source.path.relative_to(ROOT)}:{source.line}: {source.source} -> {target}")
        print(f"import circle of {len(cycle)}: {', '.join(cycle)}")
    if problems or cycles:
        print(f"{len(problems)} upward imports, {len(cycles)} circles", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
