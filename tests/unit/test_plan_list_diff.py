"""A changed list in a plan (issue 35): the elements added, removed or changed, as Terraform
shows lists, in the terminal plan and the markdown plan alike; never the whole list twice,
keys never shuffled, secrets still masked."""

from __future__ import annotations

from pathlib import Path

from dstack_plan.plan.json_plan import plan_to_json
from dstack_plan.plan.lines import Line
from dstack_plan.plan.list_diff import Element, Field, Hidden, list_diff
from dstack_plan.plan.markdown import render_markdown
from dstack_plan.plan.model import Plan
from dstack_plan.plan.planfile import load_plan, save_plan
from dstack_plan.plan.render import render_plan
from tests.unit.test_planner import desired_items, plan, state_of

HOST_1 = "    - hostname: 10.0.0.1\n      port: 22\n"
HOST_2 = "    - hostname: 10.0.0.2\n      user: admin\n      port: 2222\n"
HOST_3 = "    - port: 2200\n      hostname: 10.0.0.3\n      user: ops\n"  # keys out of order
FLEET = (
    "type: fleet\nname: onprem\n"
    "ssh_config:\n  user: ubuntu\n  identity_file: ~/.ssh/id\n  hosts:\n"
)

TASK = """\
type: task
name: train
env:
  - HF_TOKEN=${{ secrets.HF_TOKEN }}
  - EPOCHS=3
commands:
  - pip install -r requirements.txt
  - python prepare.py
  - python train.py
  - python eval.py
  - python export.py
"""


def _plan(tmp_path: Path, before: str, after: str) -> Plan:
    state = state_of(desired_items(tmp_path / "before", before))
    return plan(desired_items(tmp_path / "after", after), state)


def _text(lines: list[Line]) -> str:
    return "\n".join(
        line if isinstance(line, str) else "".join(p if isinstance(p, str) else p[0] for p in line)
        for line in lines
    )


def _terminal(made: Plan) -> str:
    return _text(render_plan(made))


def _markdown(made: Plan) -> str:
    return render_markdown(plan_to_json(made))


def test_an_added_host_is_the_only_one_shown(tmp_path: Path) -> None:
    made = _plan(tmp_path, FLEET + HOST_1 + HOST_2, FLEET + HOST_1 + HOST_2 + HOST_3)
    terminal = _terminal(made)
    assert (
        "      ~ ssh_config.hosts = [\n"
        "          + {\n"
        '              + hostname = "10.0.0.3"\n'
        '              + user     = "ops"\n'
        "              + port     = 2200\n"
        "              + blocks   = 1\n"
        "            },\n"
        "            # (2 unchanged elements hidden)\n"
        "        ]\n"
    ) in terminal
    markdown = _markdown(made)
    assert (
        "  ssh_config.hosts = [\n"
        "+   {\n"
        '+     hostname = "10.0.0.3"\n'
        '+     user = "ops"\n'
        "+     port = 2200\n"
        "+     blocks = 1\n"
        "+   }\n"
        "    # (2 unchanged elements hidden)\n"
        "  ]\n"
    ) in markdown
    for text in (terminal, markdown):
        assert "10.0.0.1" not in text and "10.0.0.2" not in text


def test_a_removed_host_is_shown_with_minus(tmp_path: Path) -> None:
    made = _plan(tmp_path, FLEET + HOST_1 + HOST_2, FLEET + HOST_2)
    terminal = _terminal(made)
    assert (
        "          - {\n"
        '              - hostname = "10.0.0.1"\n'
        "              - port     = 22\n"
        "              - blocks   = 1\n"
        "            },\n"
        "            # (1 unchanged element hidden)\n"
    ) in terminal
    markdown = _markdown(made)
    assert '-   {\n-     hostname = "10.0.0.1"\n-     port = 22\n-     blocks = 1\n-   }\n' in (
        markdown
    )
    assert "    # (1 unchanged element hidden)\n" in markdown
    for text in (terminal, markdown):
        assert "10.0.0.2" not in text


def test_a_host_whose_port_changed_shows_only_the_port(tmp_path: Path) -> None:
    moved = HOST_2.replace("2222", "2223")
    made = _plan(tmp_path, FLEET + HOST_1 + HOST_2, FLEET + HOST_1 + moved)
    terminal = _terminal(made)
    assert (
        "          ~ {\n"
        '                hostname = "10.0.0.2"\n'
        "              ~ port     = 2222 -> 2223\n"
        "                # (2 unchanged attributes hidden)\n"  # user, blocks
        "            },\n"
        "            # (1 unchanged element hidden)\n"
    ) in terminal
    markdown = _markdown(made)
    assert (
        "    {\n"
        '      hostname = "10.0.0.2"\n'
        "-     port = 2222\n"
        "+     port = 2223\n"
        "      # (2 unchanged attributes hidden)\n"
        "    }\n"
    ) in markdown
    for text in (terminal, markdown):
        assert "admin" not in text and "10.0.0.1" not in text


def test_a_command_added_in_the_middle_shows_its_neighbours(tmp_path: Path) -> None:
    after = TASK.replace("  - python train.py\n", "  - python train.py\n  - python check.py\n")
    made = _plan(tmp_path, TASK, after)
    terminal = _terminal(made)
    assert (
        "      ~ commands = [ # forces replacement\n"
        "            # (2 unchanged elements hidden)\n"
        '            "python train.py",\n'
        '          + "python check.py",\n'
        '            "python eval.py",\n'
        "            # (1 unchanged element hidden)\n"
        "        ]\n"
    ) in terminal
    markdown = _markdown(made)
    assert (
        "  commands = [  # forces replacement\n"
        "    # (2 unchanged elements hidden)\n"
        '    "python train.py"\n'
        '+   "python check.py"\n'
        '    "python eval.py"\n'
        "    # (1 unchanged element hidden)\n"
        "  ]\n"
    ) in markdown
    for text in (terminal, markdown):
        assert "prepare.py" not in text and "export.py" not in text


def test_secrets_stay_masked_in_env_and_list_elements(tmp_path: Path) -> None:
    after = TASK.replace("secrets.HF_TOKEN", "secrets.HF_TOKEN_2").replace(
        "  - python train.py\n",
        "  - python login.py --token ${{ secrets.HF_TOKEN_2 }}\n  - python train.py\n",
    )
    made = _plan(tmp_path, TASK, after)
    terminal = _terminal(made)
    assert "~ env.HF_TOKEN = (sensitive) -> (sensitive)" in terminal
    assert '            "python prepare.py",\n          + (sensitive),\n' in terminal
    markdown = _markdown(made)
    assert "- env.HF_TOKEN = (sensitive)\n+ env.HF_TOKEN = (sensitive)" in markdown
    assert '    "python prepare.py"\n+   (sensitive)\n' in markdown
    for text in (terminal, markdown):
        assert "secrets." not in text and "login.py" not in text and "HF_TOKEN_2" not in text


def test_a_saved_plan_renders_the_keys_in_the_same_order(tmp_path: Path) -> None:
    """A saved plan's JSON sorts keys: the element's keys still read as in a fresh plan."""
    moved = HOST_2.replace("2222", "2223")
    made = _plan(tmp_path, FLEET + HOST_1 + HOST_2, FLEET + HOST_1 + moved + HOST_3)
    save_plan(made, tmp_path / "plan.json")
    loaded = load_plan(tmp_path / "plan.json")
    assert list(loaded.changes[0].after["ssh_config"]["hosts"][2]) == sorted(  # type: ignore[index]
        ["hostname", "user", "port", "blocks"]
    )
    assert _terminal(loaded) == _terminal(made)
    assert _markdown(loaded) == _markdown(made)


def test_hosts_sharing_an_address_are_told_apart_by_port() -> None:
    def spec(*ports: int) -> dict[str, object]:
        hosts = [{"hostname": "10.0.0.9", "port": p, "blocks": 1} for p in ports]
        return {"ssh_config": {"hosts": hosts}}

    entries = list_diff("fleet", "ssh_config.hosts", spec(2201, 2202), spec(2202))
    assert entries == (
        Element(
            "-",
            {"hostname": "10.0.0.9", "port": 2201, "blocks": 1},
            None,
            (
                Field("-", "hostname", "10.0.0.9", None),
                Field("-", "port", 2201, None),
                Field("-", "blocks", 1, None),
            ),
        ),
        Hidden(1),
    )


def test_a_value_that_is_not_a_list_on_both_sides_is_not_a_list_diff() -> None:
    assert list_diff("task", "commands", {"commands": ["a"]}, {}) is None
