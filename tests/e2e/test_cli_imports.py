"""What `dstack --help` and `dstack plan` import: only what they need, so the CLI starts fast.

benchmarks/cli_startup.py measures the time; this keeps the lazy imports from regressing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import Dstack

PROBE = """
import json, sys
sys.argv = ["dstack", *sys.argv[1:]]
from dstack_plan.cli.__main__ import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

TASK = "type: task\nname: hello\ncommands: [echo hi]\nresources: {cpu: 1.., memory: 0.1GB..}\n"


def imported(args: list[str], cwd: Path, env: dict[str, str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def test_help_imports_no_models_loop_or_http(tmp_path: Path, cli_env: dict[str, str]) -> None:
    modules = imported(["--help"], tmp_path, cli_env)
    assert "typer" in modules
    for heavy in ("pydantic", "asyncio", "httpx", "rich", "yaml", "ruamel"):
        assert heavy not in modules, heavy
    assert not any(m.startswith("dstack_plan.config") for m in modules)


def test_plan_imports_what_planning_needs_only(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "hello.dstack.yml").write_text(TASK)
    assert dstack("plan").returncode == 0  # a first plan, with nothing cached
    modules = imported(["plan"], project, cli_env)
    assert "dstack_plan.project" in modules and "dstack_plan.graph.dag" in modules
    # a plan orders its changes by the DAG's topological generations: networkx's algorithm
    # (the design names it), bought with ~80-120 ms of import (see docs/graph.md)
    assert "networkx" in modules
    not_needed = [
        "dstack_plan.config.locate",  # locating config errors
        "dstack_plan.apply.engine",  # applying
        "dstack_plan.agent.daemon",  # starting an agent that already runs
        "dstack_plan.config.fleet",  # kinds the project does not declare
        "dstack_plan.config.volume",
        "dstack_plan.config.gateway",
        "dstack_plan.cli.apply_cmd",  # commands other than the one run
        "pickle",  # results of forked loaders (a project this small is loaded in-process)
        "asyncssh",  # SSH (~0.12 s of import): this project has no SSH fleet nor gateway
        "dstack_plan.proxy.gateway_install",  # a gateway's relay, installed over SSH
    ]
    assert [m for m in not_needed if m in modules] == []


def test_commands_that_need_no_graph_do_not_import_networkx(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "hello.dstack.yml").write_text(TASK)
    for args in (["ps"], ["validate"], ["state", "list"], ["logs", "task.hello"]):
        assert "networkx" not in imported(args, project, cli_env), args
    assert "networkx" in imported(["graph"], project, cli_env)
