"""The markdown plan (a pull-request comment): golden files of plans made by the real planner
with every action kind, and the properties a comment must keep (no secrets, no markup leaks).

Regenerate the golden files after an intended change with `DSTACK_PLAN_UPDATE_GOLDEN=1`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.plan.json_plan import plan_to_json
from dstack_plan.plan.markdown import MARKER, render_markdown
from dstack_plan.plan.model import Action, Cost, Placement, Plan
from dstack_plan.plan.policy_report import PolicyReport, RuleResult
from tests.unit.test_planner import desired_items, plan, state_of

GOLDEN = Path(__file__).parent / "golden"

KEEP = "type: fleet\nname: pool\nnodes: 2\nresources: {gpu: A100:8}\n"
SERVICE = "type: service\nname: llm\ncommands: [serve]\nport: 8000\nreplicas: 1\n"
EVAL = "type: task\nname: eval\ncommands: [python eval.py]\nresources: {gpu: A100:2}\n"
CANARY = (
    "type: task\nname: canary\ncommands: [python canary.py]\nresources: {gpu: L4:1}\n"
    "lifecycle: {create_before_destroy: true}\n"
)
OLD = "type: task\nname: old\ncommands: [echo old]\n"
TRAIN = """\
type: task
name: train
image: nvcr.io/nvidia/pytorch:24.01-py3
env:
  - HF_TOKEN=${{ secrets.HF_TOKEN }}
  - EPOCHS=3
commands:
  - pip install -r requirements.txt
  - python train.py --epochs $EPOCHS
ports: [6006]
max_duration: 2h
priority: 50
resources: {gpu: H100:8, shm_size: 16GB}
"""


def every_action_plan(tmp_path: Path) -> Plan:
    """create (long, folded) · update in place · replace · create-before-destroy replace ·
    delete · no-op, with a pending and an unplaceable placement, from the real planner."""
    before = [KEEP, SERVICE, EVAL, CANARY, OLD]
    after = [
        KEEP,
        SERVICE.replace("replicas: 1", "replicas: 2"),
        EVAL.replace("A100:2", "A100:4"),
        CANARY.replace("L4:1", "L4:2"),
        TRAIN,
    ]
    state = state_of(desired_items(tmp_path / "a", "---\n".join(before)))
    made = plan(desired_items(tmp_path / "b", "---\n".join(after)), state)
    placements = {
        "task.train": Placement(
            fleet="pool", provider="aws", price_per_hour=98.32, placed=False, pending=True,
            note="pending: waits for 8 GPUs on pool, busy with task.eval",
        ),
        "task.eval": Placement(
            fleet="pool", provider="aws", hosts=("pool-0",), price_per_hour=32.77, placed=True
        ),
        "service.llm": Placement(fleet="pool", provider="aws", price_per_hour=1.5),
        "task.canary": Placement(
            fleet="local", provider="local", placed=False, note="vm: needs 2 GPUs L4, has none"
        ),
    }  # fmt: skip
    changes = tuple(
        dataclasses.replace(c, placement=placements.get(c.address, c.placement))
        for c in made.changes
    )
    return made.model_copy(update={"changes": changes, "cost": Cost(before=34.27, after=132.59)})


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("DSTACK_PLAN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with DSTACK_PLAN_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file"


def test_every_action_kind_matches_golden(tmp_path: Path) -> None:
    made = every_action_plan(tmp_path)
    kinds = {c.action for c in made.changes}
    assert kinds == set(Action), kinds  # the fixture really covers every action
    text = render_markdown(plan_to_json(made))
    check_golden("plan_every_action.md", text)
    # what a reviewer relies on, independent of the golden file's layout
    assert text.startswith(MARKER + "\n")
    assert f"**{made.summary()}**" in text
    assert "$34.27/h → $132.59/h (+$98.32/h)" in text
    for title in ("Create (1)", "Update in place (1)", "Replace (2)", "Destroy (1)"):
        assert f"#### {title}" in text
    assert "1 unchanged resource not shown." in text
    assert "`fleet.pool`" not in text  # the no-op is counted, not listed
    assert "- `task.train`: pending: waits for 8 GPUs" in text
    assert '+ resources.gpu = "A100:4"  # forces replacement' in text
    assert "(create before destroy)" in text
    assert "- `task.canary`: cannot be placed: vm: needs 2 GPUs L4, has none" in text
    assert "`pool` (aws), machines known after apply" in text
    assert "<details><summary><code>task.train</code>" in text  # the long create is folded


def test_policy_warnings_and_targets_match_golden(tmp_path: Path) -> None:
    made = every_action_plan(tmp_path)
    report = PolicyReport(
        denied=True,
        rules=(
            RuleResult(name="max-gpus", file="policies/max-gpus.yml", severity="deny",
                       outcome="fail", message="task.train asks for 8 GPUs | more than 4"),
            RuleResult(name="max-cost", file="policies/max-cost.yml", severity="warn",
                       outcome="fail", message="cost after apply is $132.59/h"),
            RuleResult(name="protect-volumes", file="policies/protect-volumes.yml",
                       severity="deny", outcome="pass", message="a volume would be destroyed"),
        ),
    )  # fmt: skip
    warned = made.model_copy(
        update={"warnings": ("state lock held by ci-42 was broken",), "targets": ("task.eval",)}
    )
    document = plan_to_json(warned, report)  # the policy section as `dstack plan` writes it
    text = render_markdown(document)
    check_golden("plan_policy.md", text)
    assert "### dstack plan: denied by policy" in text
    assert "#### Policy: ❌ denied (1 of 3 rules passed)" in text
    assert "8 GPUs \\| more than 4" in text  # a pipe in a message does not split the table
    assert "a volume would be destroyed" not in text  # a passed rule's message is not shown


def test_no_changes(tmp_path: Path) -> None:
    items = desired_items(tmp_path, KEEP + "---\n" + SERVICE)
    text = render_markdown(plan_to_json(plan(items, state_of(items))))
    check_golden("plan_no_changes.md", text)
    assert "**No changes.** Your infrastructure matches the configuration." in text
    assert "2 unchanged resources not shown." in text
    assert "####" not in text


def test_secret_references_are_masked(tmp_path: Path) -> None:
    text = render_markdown(plan_to_json(every_action_plan(tmp_path)))
    assert "HF_TOKEN" in text and "(sensitive)" in text
    assert "secrets." not in text


def test_text_cannot_inject_markup() -> None:
    document: dict[str, Any] = {
        "resource_changes": [
            {
                "address": "task.x",
                "type": "task",
                "change": {"actions": ["delete"], "before": None, "after": None},
                "reason": "<img src=x onerror=alert(1)> | ``` *bold*",
                "placement": None,
            }
        ],
        "summary": {"add": 0, "change": 0, "destroy": 1},
        "cost": {"before": 0.0, "after": 0.0},
    }
    text = render_markdown(document)
    assert not re.search(r"(?<!\\)<img", text) and "\\<img" in text
    assert "\\| \\`\\`\\` \\*bold\\*" in text


def test_values_with_backticks_get_a_longer_fence(tmp_path: Path) -> None:
    task = "type: task\nname: tick\ncommands: ['echo ```done```']\n"
    text = render_markdown(plan_to_json(plan(desired_items(tmp_path, task), state_of([]))))
    assert "````diff" in text and "\n````\n" in text


@pytest.mark.parametrize("destroy", [False, True])
def test_empty_plan_message(destroy: bool) -> None:
    document = {"resource_changes": [], "destroy": destroy, "cost": {}}
    text = render_markdown(document)
    wanted = "No objects need to be destroyed." if destroy else "matches the configuration"
    assert wanted in text


def many_creates(tmp_path: Path, count: int) -> dict[str, Any]:
    text = "---\n".join(
        f"type: task\nname: t{i}\ncommands: [echo {i}]\nresources: {{gpu: A100:2}}\n"
        for i in range(count)
    )
    return plan_to_json(plan(desired_items(tmp_path, text), state_of([])))


def test_a_large_plan_leaves_out_the_diffs_to_fit_a_comment(tmp_path: Path) -> None:
    document = many_creates(tmp_path, 200)
    full = render_markdown(document, max_chars=10**9)
    assert "```diff" in full and len(full) > 40_000
    text = render_markdown(document, max_chars=40_000)
    assert len(text) <= 40_000
    assert "```diff" not in text and "Attribute diffs are left out" in text
    assert all(f"`task.t{i}`" in text for i in range(200))  # every change still listed


def test_a_huge_plan_is_cut_and_says_so(tmp_path: Path) -> None:
    document = many_creates(tmp_path, 200)
    document["policy"] = {"denied": False, "rules": [
        {"name": "max-gpus", "file": "p.yml", "severity": "deny", "outcome": "pass",
         "message": "too many"}]}  # fmt: skip
    text = render_markdown(document, max_chars=5_000)
    assert len(text) <= 5_000
    assert "**Plan: 200 to add, 0 to change, 0 to destroy.**" in text
    assert "#### Policy: ✅ passed" in text  # the outcome comes before anything is cut
    assert "more lines cut to fit 5,000 characters" in text
    assert text.count("<details>") == text.count("</details>")


def test_github_comment_limit_is_the_default(tmp_path: Path) -> None:
    text = render_markdown(many_creates(tmp_path, 1200))
    assert len(text) <= 65_536
