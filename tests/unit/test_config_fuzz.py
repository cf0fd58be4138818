"""Whatever the input, loading either succeeds or raises our ConfigError with a location."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstack_plan.config.loader import load_text
from tests.conftest import REPO_ROOT
from tests.unit.test_config_conformance import conformance_files

SEEDS = [
    p.read_text() for p in sorted((REPO_ROOT / "examples").rglob("*.y*ml")) + conformance_files()
]
SEED_DOCS = [d for text in SEEDS for d in yaml.safe_load_all(text) if isinstance(d, dict)]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["1..", "..", "A100:80GB:2", "off", "-1", "${{ x.y }}", "${{", "2h", "8GB"]),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def check(text: str) -> None:
    resources, issues = load_text(text, "fuzz.dstack.yml")
    for issue in issues:
        assert issue.file == "fuzz.dstack.yml"
        assert issue.line >= 1 and issue.column >= 1
        assert issue.message
    if not issues:
        assert all(r.address for r in resources)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(max_size=200))
def test_random_text(text: str) -> None:
    check(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(values)
def test_random_yaml_values(value: object) -> None:
    check(yaml.safe_dump(value))


@st.composite
def mutated_documents(draw: st.DrawFn) -> dict:
    doc = dict(draw(st.sampled_from(SEED_DOCS)))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "delete", "rename", "nest"]))
        keys = list(doc)
        if action == "set" or not keys:
            key = draw(st.sampled_from(keys + ["resources", "gpu", "nodes", "type", "env"]))
            doc[key] = draw(values)
        elif action == "delete":
            doc.pop(draw(st.sampled_from(keys)))
        elif action == "rename":
            key = draw(st.sampled_from(keys))
            doc[key + draw(st.text(min_size=1, max_size=3))] = doc.pop(key)
        else:
            key = draw(st.sampled_from(keys))
            doc[key] = {draw(st.text(max_size=5)): doc[key]}
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_documents())
def test_mutations_of_valid_configs(doc: dict) -> None:
    check(yaml.safe_dump(doc, sort_keys=False))


def test_seeds_are_valid() -> None:
    assert SEED_DOCS
    for text in SEEDS:
        _, issues = load_text(text, "seed.dstack.yml")
        assert not issues, [str(i) for i in issues]


def test_fuzz_corpus_reaches_several_kinds(tmp_path: Path) -> None:
    assert len({d.get("type") for d in SEED_DOCS}) >= 5
