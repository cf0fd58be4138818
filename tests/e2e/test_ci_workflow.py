"""The CI examples run: the `dstack` commands of `examples/ci/*.yml`, taken from the files
themselves, in order, in a temporary git repository on the local fleet, with the S3 state
backend on moto standing in for the team's bucket. A wrong command in an example fails here.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import Dstack

EXAMPLES = REPO_ROOT / "examples" / "ci"
POLICIES = REPO_ROOT / "examples" / "policies"
SHELL_ENDS = {"||", "&&", ";", "|", ">", ">>"}
TASK = """\
type: task
name: {name}
commands:
  - echo {name}
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
"""


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = YAML(typ="safe").load((EXAMPLES / name).read_text())
    return data


def shell_lines(example: str, job: str) -> list[str]:
    """The shell lines the job runs: GitHub's `steps[].run`, GitLab's `script`."""
    data = load(example)
    if example == "github-actions.yml":
        texts = [s["run"] for s in data["jobs"][job]["steps"] if "run" in s]
    else:
        texts = list(data[job]["script"])
    return [line.strip() for text in texts for line in text.splitlines()]


def dstack_commands(example: str, job: str) -> list[list[str]]:
    """Each `dstack ...` command of the job, as arguments, up to the first shell operator."""
    commands = []
    for line in shell_lines(example, job):
        if not line.startswith("dstack "):
            continue
        words = shlex.split(line)
        end = next((i for i, w in enumerate(words) if w in SHELL_ENDS), len(words))
        commands.append(words[1:end])
    return commands


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize("example", ["github-actions.yml", "gitlab-ci.yml"])
def test_examples_keep_the_files_they_pass_between_jobs(example: str) -> None:
    (plan,) = dstack_commands(example, "plan")
    (apply,) = dstack_commands(example, "apply")
    assert plan[0] == "plan" and "--detailed-exitcode" in plan and "--policy" in plan
    saved, markdown = option(plan, "-out"), option(plan, "--markdown")
    assert apply == ["apply", saved]
    data = load(example)
    if example == "github-actions.yml":
        steps = data["jobs"]["plan"]["steps"]
        uploads = [s["with"]["path"] for s in steps if "upload-artifact" in s.get("uses", "")]
        assert uploads == [saved]
        comment = next(s for s in steps if "github-script" in s.get("uses", ""))
        assert f"'{markdown}'" in comment["with"]["script"]
        assert data["env"]["DSTACK_STATE"] == "${{ vars.DSTACK_STATE }}"
    else:
        assert saved in data["plan"]["artifacts"]["paths"]
        assert any(f"body@{markdown}" in line for line in shell_lines(example, "plan"))
        assert any(f"artifacts/{saved}" in line for line in shell_lines(example, "apply"))


@pytest.mark.parametrize("example", ["github-actions.yml", "gitlab-ci.yml"])
@pytest.mark.parametrize("job", ["plan", "apply"])
def test_example_shell_parses(example: str, job: str, tmp_path: Path) -> None:
    data = load(example)
    if example == "github-actions.yml":
        scripts = [s["run"] for s in data["jobs"][job]["steps"] if "run" in s]
    else:
        scripts = [*data["default"]["before_script"], *data[job]["script"]]
    script = tmp_path / "job.sh"
    script.write_text("\n".join(scripts) + "\n")
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com", *args],
        cwd=repo, check=True, capture_output=True,
    )  # fmt: skip


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.mark.aws
@pytest.mark.parametrize("example", ["github-actions.yml", "gitlab-ci.yml"])
def test_example_commands_gate_and_apply(
    example: str, dstack: Dstack, tmp_path: Path, s3_bucket: Any, cli_env: dict[str, str]
) -> None:
    cli_env.update(s3_bucket.env, DSTACK_STATE=s3_bucket.url())
    repo = tmp_path / "project"
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text(".dstack/\n")
    shutil.copytree(POLICIES, repo / "policies")
    (repo / "a.dstack.yml").write_text(TASK.format(name="first"))
    commit(repo, "first task")
    (plan,) = dstack_commands(example, "plan")
    (apply,) = dstack_commands(example, "apply")
    saved, markdown = repo / option(plan, "-out"), repo / option(plan, "--markdown")

    # the pull request: changes are exit 2, with the comment and the saved plan written
    planned = dstack(*plan)
    assert planned.returncode == 2, planned.stdout + planned.stderr
    comment = markdown.read_text()
    assert "**Plan: 1 to add, 0 to change, 0 to destroy.**" in comment
    assert "`task.first`" in comment and "#### Policy: ✅ passed" in comment
    assert saved.exists()

    # the merge: apply exactly that plan
    applied = dstack(*apply)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    again = dstack(*plan)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "**No changes.**" in markdown.read_text()

    # two pull requests planned against the same state: the second to merge is stale
    (repo / "b.dstack.yml").write_text(TASK.format(name="second"))
    commit(repo, "second task")
    assert dstack(*plan).returncode == 2
    first_pr = saved.read_bytes()
    (repo / "c.dstack.yml").write_text(TASK.format(name="third"))
    commit(repo, "third task")
    assert dstack(*plan).returncode == 2
    assert dstack(*apply).returncode == 0
    saved.write_bytes(first_pr)
    stale = dstack(*apply)
    assert stale.returncode == 1
    assert "stale" in stale.stdout + stale.stderr
    assert "Traceback" not in stale.stdout + stale.stderr


@pytest.mark.aws
def test_denied_plan_fails_the_job_and_still_writes_the_comment(
    dstack: Dstack, tmp_path: Path, s3_bucket: Any, cli_env: dict[str, str]
) -> None:
    cli_env.update(s3_bucket.env, DSTACK_STATE=s3_bucket.url())
    repo = tmp_path / "project"
    shutil.copytree(POLICIES, repo / "policies")
    task = TASK.format(name="pulled").replace("commands:", "image: quay.io/acme/app:1\ncommands:")
    (repo / "a.dstack.yml").write_text(task)
    (plan,) = dstack_commands("github-actions.yml", "plan")
    denied = dstack(*plan)
    assert denied.returncode == 1, denied.stdout + denied.stderr
    comment = (repo / option(plan, "--markdown")).read_text()
    assert "denied by policy" in comment and "allowed-registries" in comment


def test_markdown_output_options(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "a.dstack.yml").write_text(TASK.format(name="first"))
    printed = dstack("plan", "--format", "markdown", "--markdown", "comment.md", "-out", "p.json")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == (project / "comment.md").read_text()
    assert printed.stdout.startswith("<!-- dstack-plan -->\n") and (project / "p.json").exists()
    beside = dstack("plan", "--markdown", "beside.md")  # the terminal plan, and the file
    assert '+ task "first"' in beside.stdout and (project / "beside.md").exists()
    assert dstack("plan", "--format", "json").stdout == dstack("plan", "--json").stdout
    unwritable = dstack("plan", "--markdown", "no/such/dir/plan.md")
    assert unwritable.returncode == 1
    assert "cannot write the markdown plan to no/such/dir/plan.md" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr
    wrong = dstack("plan", "--format", "html")
    assert wrong.returncode == 1 and "'html' is not one of text, json, markdown" in wrong.stderr
