"""The published JSON Schemas are current and accept every example and conformance config."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.unit.test_config_conformance import conformance_files

SCHEMAS = REPO_ROOT / "schemas"
EXAMPLES = sorted((REPO_ROOT / "examples").rglob("*.dstack.y*ml")) + sorted(
    (REPO_ROOT / "examples").rglob(".dstack.y*ml")
)


def test_checked_in_schemas_are_current() -> None:
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        from generate_schemas import rendered
    finally:
        sys.path.pop(0)
    for name, text in rendered().items():
        path = SCHEMAS / name
        assert path.exists(), f"schemas/{name} is missing: run `make schemas`"
        assert path.read_text() == text, f"schemas/{name} is stale: run `make schemas`"


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / "dstack.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_there_is_an_example_of_every_kind() -> None:
    kinds = set()
    for path in EXAMPLES:
        kinds |= {d["type"] for d in yaml.safe_load_all(path.read_text()) if d}
    assert kinds == {"task", "service", "dev-environment", "fleet", "volume", "gateway"}


@pytest.mark.parametrize(
    "path", EXAMPLES + conformance_files(), ids=lambda p: str(p.relative_to(p.parents[1]))
)
def test_config_is_valid_against_the_published_schema(path: Path) -> None:
    validator = _validator()
    for document in yaml.safe_load_all(path.read_text()):
        errors = list(validator.iter_errors(document))
        assert not errors, [e.message for e in errors]


def test_schema_rejects_an_unknown_key() -> None:
    validator = _validator()
    assert list(validator.iter_errors({"type": "task", "commands": ["x"], "comands": ["x"]}))
    assert list(validator.iter_errors({"type": "nope"}))


def test_dstack_schema_command_prints_each_kind() -> None:
    for kind in ("task", "policy", None):
        args = [sys.executable, "-m", "dstack_plan.cli", "schema"] + ([kind] if kind else [])
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        name = f"{kind}.schema.json" if kind else "dstack.schema.json"
        assert json.loads(out) == json.loads((SCHEMAS / name).read_text())


def test_the_policy_schema_accepts_every_shipped_policy_and_rejects_a_typo() -> None:
    schema = json.loads((SCHEMAS / "policy.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    shipped = sorted((REPO_ROOT / "examples" / "policies").glob("*.yml"))
    assert len(shipped) >= 4
    for path in shipped:
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert not errors, (path.name, [e.message for e in errors])
    rule = {"name": "r", "expression": "true", "message": "m"}
    assert not list(validator.iter_errors({"rules": [rule]}))
    assert list(validator.iter_errors({"rules": [rule | {"severity": "block"}]}))
    assert list(validator.iter_errors({"rules": [{**rule, "expresion": "true"}]}))
    assert list(validator.iter_errors({"rules": []}))
