"""Config error messages speak the config's language: no pydantic wording reaches the user."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from dstack_plan.config.introspect import alternatives, field_annotation
from dstack_plan.config.kinds import KINDS, spec_class
from dstack_plan.config.loader import load_text
from tests.conftest import REPO_ROOT
from tests.unit.test_config_broken import CASES
from tests.unit.test_config_conformance import conformance_files

PYDANTIC_WORDING = re.compile(
    "|".join(
        [
            r"input should",
            r"should be a valid",
            r"should have (at least|at most)",
            r"validation errors? for",
            r"instance of",
            r"after validation",
            r"value error,",
            r"assertion failed,",
            r"type=",
            r"input_value",
            r"for further information",
            r"errors\.pydantic\.dev",
            r"pydantic",
            r"unable to (parse|interpret)",
            r"string should",
            r"field required",
            r"extra inputs are not permitted",
            r"function-(after|before|wrap|plain)",
            r"lax-or-strict",
            r"chain\[",
            r"tuple\[",
            r"nonetype",
            r"<class",
            r"dictionary",
        ]
    ),
    re.IGNORECASE,
)

MINIMAL: dict[str, dict[str, Any]] = {
    "task": {"type": "task", "name": "t1", "commands": ["x"]},
    "service": {"type": "service", "name": "s1", "commands": ["x"], "port": 80},
    "dev-environment": {"type": "dev-environment", "name": "d1", "ide": "vscode"},
    "fleet": {"type": "fleet", "name": "f1", "nodes": 1},
    "volume": {"type": "volume", "name": "v1", "backend": "aws", "region": "r", "size": 10},
    "gateway": {"type": "gateway", "name": "g1", "backend": "aws", "region": "r"},
    "preset": {"type": "preset", "name": "p1", "model": "org/model"},
}

WRONG_VALUES: list[Any] = [
    ["a", "b"],  # a list where a scalar or mapping is expected
    {"a": 1},  # a mapping where a list or scalar is expected
    "not-a-number",  # a string where a number, list or mapping is expected
    "x:y:z:w",
    42,
    -1,
    0,
    1.5,
    True,
    None,
    "",
    [[1]],
    [{"bogus": 1}],
    {"min": "x", "max": []},
]


def pydantic_wording(message: str) -> str | None:
    match = PYDANTIC_WORDING.search(message)
    return match.group(0) if match else None


def messages(text: str) -> list[str]:
    _, issues = load_text(text, "m.dstack.yml")
    return [str(i) for i in issues]


# --- the broken-config corpus -------------------------------------------------------------


@pytest.mark.parametrize("text", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_broken_corpus_messages_have_no_pydantic_wording(text: str) -> None:
    for message in messages(text):
        assert pydantic_wording(message) is None, message


# --- a wrong-type value for every field of every kind ---------------------------------------


def model_paths(model: type[BaseModel], depth: int = 4) -> Iterator[tuple[str | int, ...]]:
    """Every field path of `model`, through nested models and lists of models."""
    for name, field in model.model_fields.items():
        yield (name,)
        if depth <= 1:
            continue
        for alternative in alternatives(field_annotation(field)):
            origin = typing.get_origin(alternative)
            inner: list[tuple[tuple[str | int, ...], Any]] = [((), alternative)]
            if origin in (tuple, list):
                args = [a for a in typing.get_args(alternative) if a is not Ellipsis]
                inner = [((0,), a) for arg in args for a in alternatives(arg)]
            for prefix, candidate in inner:
                if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                    for sub in model_paths(candidate, depth - 1):
                        yield (name, *prefix, *sub)


def with_value(node: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A copy of `node` with `value` at `path`, creating mappings and one-item lists."""
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(node) if isinstance(node, list) and node else [{}]
        index = head if head < len(items) else 0
        items[index] = value if not rest else with_value(items[index], rest, value)
        return items
    mapping = dict(node) if isinstance(node, dict) else {}
    mapping[head] = value if not rest else with_value(mapping.get(head), rest, value)
    return mapping


def mutations() -> Iterator[tuple[str, str]]:
    for kind in KINDS:
        seen = set()
        for path in model_paths(spec_class(kind)):
            if path[0] == "type" or path in seen:
                continue
            seen.add(path)
            for value in WRONG_VALUES:
                document = with_value(MINIMAL[kind], path, value)
                yield f"{kind}:{'.'.join(map(str, path))}={value!r}", yaml.safe_dump(document)


def test_every_field_is_walked() -> None:
    walked = {name for name, _ in mutations()}
    # nested fields of nested models are reached too, not just the top level
    assert any(n.startswith("fleet:ssh_config.hosts.0.proxy_jump.port=") for n in walked)
    assert any(n.startswith("service:replicas.0.resources.gpu=") for n in walked)
    assert len(walked) > 2000


def test_wrong_types_in_every_field_give_config_messages() -> None:
    bad: list[str] = []
    count = 0
    for name, text in mutations():
        for message in messages(text):
            count += 1
            if pydantic_wording(message):
                bad.append(f"{name}: {message}")
    assert count > 1000  # the mutations really produce errors
    assert not bad, f"{len(bad)} messages with pydantic wording:\n" + "\n".join(bad[:40])


def corpus_documents() -> list[dict[str, Any]]:
    files = sorted((REPO_ROOT / "examples").rglob("*.dstack.y*ml")) + conformance_files()
    return [
        d for p in files for d in yaml.safe_load_all(Path(p).read_text()) if isinstance(d, dict)
    ]


def leaf_paths(node: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key != "type":
                yield (*prefix, key)
                yield from leaf_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node[:2]):
            yield (*prefix, index)
            yield from leaf_paths(value, (*prefix, index))


def test_wrong_types_in_real_configs_give_config_messages() -> None:
    bad: list[str] = []
    count = 0
    documents = corpus_documents()
    assert len(documents) >= 5  # the examples at least: an empty corpus proves nothing
    for document in documents:
        for path in leaf_paths(document):
            for value in (["a"], {"a": 1}, "not-a-number", 7, None):
                for message in messages(yaml.safe_dump(with_value(document, path, value))):
                    count += 1
                    if pydantic_wording(message):
                        bad.append(f"{'.'.join(map(str, path))}={value!r}: {message}")
    assert count > 100
    assert not bad, f"{len(bad)} messages with pydantic wording:\n" + "\n".join(bad[:40])


# --- what the messages say ------------------------------------------------------------------


TASK = "type: task\nname: t1\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            TASK + "commands: echo hi\n",
            "m.dstack.yml:3:11: error: commands: expected a list of strings, got 'echo hi'",
        ),
        (
            "type: service\ncommands: [x]\nport: [80]\n",
            'm.dstack.yml:3:7: error: port: expected a port such as 8080 or "8080:80", got a list',
        ),
        (
            TASK + "commands: [x]\nports: [[8080, 80]]\n",
            'm.dstack.yml:4:9: error: ports.0: expected a port such as 8080 or "8080:80", '
            "got a list",
        ),
        (
            TASK + "commands: [x]\npriority: 200\n",
            "m.dstack.yml:4:11: error: priority: must be at most 100, got 200",
        ),
        (
            TASK + "commands: [x]\nrepos: [a, b]\n",
            "m.dstack.yml:4:8: error: repos: must have at most 1 item, got 2",
        ),
        (
            TASK + "commands: [x]\nspot_policy: sometimes\n",
            "m.dstack.yml:4:14: error: spot_policy: expected 'spot', 'on-demand' or 'auto', "
            "got 'sometimes'",
        ),
        (
            TASK + "commands: [x]\nnodes: many\n",
            "m.dstack.yml:4:8: error: nodes: expected an integer, got 'many'",
        ),
        (
            TASK + "commands: [x]\nenv: 5\n",
            "m.dstack.yml:4:6: error: env: expected a list of KEY=VALUE / KEY entries or a "
            "mapping, got 5",
        ),
        (
            TASK + "commands: [x]\nenv:\n  A: [1]\n",
            "m.dstack.yml:5:6: error: env.A: expected a string or a number, got list",
        ),
        (
            TASK + "commands: [x]\nenv: [A=1, A=2]\n",
            "m.dstack.yml:4:6: error: env: variable 'A' is set twice",
        ),
    ],
)
def test_messages_in_config_terms(text: str, expected: str) -> None:
    assert messages(text) == [expected]


def test_a_union_reports_once_what_it_takes() -> None:
    # every alternative mismatched: one message naming them all
    # (a number is a name, as in dstack: `gateway: 5` is the gateway "5")
    assert messages("type: service\ncommands: [x]\nport: 80\ngateway: [5]\n") == [
        "m.dstack.yml:4:10: error: gateway: expected true, false, a name (or <project>/<name>) "
        "or a mapping {name, project}, got a list"
    ]
    assert messages(TASK + "commands: [x]\nvolumes: [5]\n") == [
        'm.dstack.yml:4:11: error: volumes.0: expected a volume such as "name:/path", '
        '"/host/path:/path" or {name, path}, got 5'
    ]


def test_a_union_reports_the_alternative_the_value_looks_like() -> None:
    # a mapping in `fleets` is a FleetRef: its problems, not "expected a string"
    assert messages(TASK + "commands: [x]\nfleets: [{nam: gpu}]\n") == [
        "m.dstack.yml:4:10: error: fleets.0: missing required key 'name'",
        "m.dstack.yml:4:11: error: unknown key 'nam' (did you mean 'name'?)",
    ]
    # a list of replicas is replica groups: one message about the item, not two
    assert messages("type: service\ncommands: [x]\nport: 80\nreplicas: [1]\n") == [
        "m.dstack.yml:4:12: error: replicas.0: expected a replica group "
        "{name, replicas, commands, ...}, got 1"
    ]
