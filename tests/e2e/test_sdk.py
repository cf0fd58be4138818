"""The Python SDK on the local fleet with a real agent: `submit_task` applies a task through
plan/apply (targeted: the project's files are left alone), the handle waits, reads logs and
stops; a bad field is an error that names its path; everything also works inside a running
event loop (Jupyter), with the async twins; and the quickstart notebook runs with nbclient."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dstack_plan import Project, SpecError, Task, asubmit_task, submit_task
from dstack_plan.sdk import apply
from tests.conftest import REPO_ROOT
from tests.e2e.test_local_flow import state

NOTEBOOK = REPO_ROOT / "examples" / "notebooks" / "quickstart.ipynb"


@pytest.fixture
def project(tmp_path: Path, agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DSTACK_PLAN_AGENT_DIR", str(agent_dir))  # stopped after the test
    path = tmp_path / "project"
    path.mkdir()
    # declared in a file, never applied: a submission must not touch it
    (path / "other.dstack.yml").write_text("type: task\nname: other\ncommands: [echo other]\n")
    return path


def test_submit_wait_logs_and_the_files_left_alone(project: Path) -> None:
    run = submit_task(
        commands=["echo hello from $DSTACK_RUN_NAME, $GREETING"],
        env={"GREETING": "hi"},
        name="hello",
        project=project,
    )
    assert run.address == "task.hello"
    assert run.wait(timeout=60) == "done"
    assert run.logs() == "hello from hello, hi\n"
    assert [j.exit_code for j in run.jobs] == [0]
    assert "task.hello: done" in run._repr_html_()
    assert set(state(project)["resources"]) == {"task.hello"}  # task.other untouched


def test_a_bad_field_is_an_error_naming_its_path(project: Path) -> None:
    with pytest.raises(SpecError) as info:
        submit_task(commands=["true"], resources={"memory": "lots"}, project=project)
    assert "resources.memory: invalid memory range 'lots'" in str(info.value)
    assert not (project / ".dstack" / "state.json").exists()  # nothing was applied


def test_inside_a_running_event_loop_and_async(project: Path) -> None:
    async def notebook_cell() -> tuple[str, str]:
        # a notebook's code runs while its loop runs: the plain calls still work
        run = submit_task(commands=["sleep 300"], name="sleeper", project=project)
        assert run.status() in ("submitted", "running")
        stopped = run.stop()
        # and the async twins, for async code
        other = await asubmit_task(commands=["echo async"], name="quick", project=project)
        assert await other.await_end(timeout=60) == "done"
        return stopped, await other.alogs()

    stopped, logs = asyncio.run(notebook_cell())
    assert stopped == "terminated"
    assert logs == "async\n"


def test_builders_next_to_the_yaml_files(project: Path) -> None:
    plan = apply([Task(name="built", commands=["echo built"])], project)
    assert "create" in plan._repr_html_() and "task.built" in plan._repr_html_()
    # Project takes them too: the files' task and the built one are planned together
    both = Project(project, configs=[Task(name="built", commands=["echo built"]).resource()])
    planned, _ = asyncio.run(both.plan())
    actions = {c.address: c.action.value for c in planned.changes}
    assert actions == {"task.built": "no-op", "task.other": "create"}
    duplicate = Project(project, configs=[Task(name="other", commands=["true"]).resource()])
    with pytest.raises(Exception, match="task.other is also declared in other.dstack.yml"):
        duplicate.load()


def test_the_quickstart_notebook_runs(project: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3")
    client.execute(cwd=str(project))
    outputs = [
        o.get("text", "") or json.dumps(o.get("data", {}))
        for cell in notebook.cells
        for o in cell.get("outputs", [])
    ]
    text = "\n".join(outputs)
    assert "hello from the notebook" in text
    assert "done" in text
