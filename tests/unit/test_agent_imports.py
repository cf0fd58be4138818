"""The daemon runs on a bare host: its modules import only the stdlib, docker and each other."""

from __future__ import annotations

import ast
import sys

from dstack_plan import __version__
from dstack_plan.agent.build import AGENT_DIR, daemon_files
from dstack_plan.agent.protocol import AGENT_VERSION

ALLOWED_THIRD_PARTY = {"docker"}


def imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_daemon_modules_import_only_the_stdlib_docker_and_daemon_modules() -> None:
    daemon_modules = {
        "dstack_plan.agent." + str(p.with_suffix("")).replace("/", ".") for p in daemon_files()
    }
    daemon_modules |= {"dstack_plan.agent", "dstack_plan.agent.runtimes"}
    offenders = {}
    for path in daemon_files():
        for name in imported_modules((AGENT_DIR / path).read_text()):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
                continue
            if name in daemon_modules or name.rsplit(".", 1)[0] in daemon_modules:
                continue
            offenders.setdefault(str(path), []).append(name)
    assert offenders == {}


def test_client_side_modules_are_not_part_of_the_daemon() -> None:
    names = {str(p) for p in daemon_files()}
    assert {"client.py", "http.py", "api_models.py", "build.py"}.isdisjoint(names)
    assert {"server.py", "daemon.py", "runtimes/docker_runtime.py"} <= names


def test_agent_version_matches_the_package() -> None:
    assert AGENT_VERSION == __version__
