"""Our loader's verdict on every case of the conformance corpus matches dstack 0.22.5's.

The corpus is `tests/conformance/<area>.yml`, each a list of cases:

    - name: preset-minimal            # unique within the area
      rule: type preset is a configuration type of its own
      config: |                       # one configuration document, as a user writes it
        type: preset
        ...
      ours: reject                    # optional: where we differ from dstack's parser on
      why: ...                        # purpose, and why (docs/configuration.md lists them)

dstack's verdicts are recorded beside each area in `<area>.verdicts.json` by
`scripts/dstack_verdicts.py`; this test does not need dstack. A case we reject must be
rejected with located errors worded in the config's terms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dstack_plan.config.loader import load_text
from tests.unit.test_config_messages import pydantic_wording

CORPUS = Path(__file__).resolve().parents[1] / "conformance"


def _cases() -> list[Any]:
    params = []
    for area_file in sorted(CORPUS.glob("*.yml")):
        area = area_file.stem
        verdicts_file = area_file.with_name(f"{area}.verdicts.json")
        verdicts = json.loads(verdicts_file.read_text()) if verdicts_file.exists() else {}
        for case in yaml.safe_load(area_file.read_text(encoding="utf-8")) or []:
            params.append(
                pytest.param(case, verdicts.get(case["name"]), id=f"{area}/{case['name']}")
            )
    return params


CASES = _cases()


def test_the_corpus_covers_both_directions() -> None:
    verdicts = [v["dstack"] for _, v in (p.values for p in CASES) if v]
    assert verdicts.count("accept") >= 10 and verdicts.count("reject") >= 10


@pytest.mark.parametrize(("case", "verdict"), CASES)
def test_we_agree_with_dstack(case: dict[str, Any], verdict: dict[str, str] | None) -> None:
    assert verdict is not None, "no dstack verdict recorded: run scripts/dstack_verdicts.py"
    expected = case.get("ours", verdict["dstack"])
    if "ours" in case:
        assert case["ours"] != verdict["dstack"], "`ours` only where we differ from dstack"
        assert case.get("why"), "a case where we differ from dstack says why"
    resources, issues = load_text(case["config"], "case.dstack.yml", name_hint="case")
    messages = [f"{i.line}:{i.column}: {i.message}" for i in issues]
    if expected == "accept":
        assert not issues, f"dstack accepts this; we said: {messages}"
        assert len(resources) == 1
        return
    assert issues, f"dstack rejects this ({verdict.get('error')}); we accepted it"
    for issue in issues:
        assert issue.line >= 1 and issue.column >= 1
        assert pydantic_wording(issue.message) is None, issue.message
