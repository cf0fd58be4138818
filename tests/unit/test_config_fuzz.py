"""Whatever the input, loading either succeeds or raises our ConfigError with a location."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstack_plan.config.loader import load_text
from tests.conftest import REPO_ROOT
from tests.unit.test_config_conformance import conformance_files

SEEDS = [  # the dstack configs among the examples (not CI pipelines or policy files)
    p.read_text()
    for p in sorted((REPO_ROOT / "examples").rglob("*.dstack.y*ml")) + conformance_files()
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


# --- hostile YAML: merge keys, explicit tags, anchors and aliases, odd characters ----------
# Strategies that would have found the internal errors, blow-ups and 1:1 locations of issue 11.

TAGS = [
    "!!str", "!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!!binary", "!!map",
    "!!seq", "!!set", "!!omap", "!!pairs", "!!merge", "!custom", "!!python/name:os.system",
]  # fmt: skip
ODD_CHARS = ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\t", "\ufffe", "\u2028", "\udcff", "\r"]
KEYS = ["type", "name", "commands", "env", "resources", "gpu", "nodes", "<<", "image", "x"]


@st.composite
def hostile_flow(draw: st.DrawFn, anchors: list[str], depth: int = 0) -> str:
    """A flow-style YAML value, decorated with tags, anchors, aliases and merge keys."""
    if anchors and draw(st.integers(0, 5)) == 0:
        return "*" + draw(st.sampled_from(anchors))
    kind = draw(st.sampled_from(["scalar", "map", "seq"] if depth < 4 else ["scalar"]))
    if kind == "scalar":
        text = draw(st.sampled_from(["echo", "1", "-1", "maybe", "2020-01-01", "24GB", "''"]))
    elif kind == "seq":
        items = draw(st.lists(hostile_flow(anchors, depth + 1), max_size=4))
        text = "[" + ", ".join(items) + "]"
    else:
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=4))  # repeats: duplicate keys
        pairs = [f"{k}: {draw(hostile_flow(anchors, depth + 1))}" for k in keys]
        text = "{" + ", ".join(pairs) + "}"
    if draw(st.integers(0, 3)) == 0:
        text = f"{draw(st.sampled_from(TAGS))} {text}"
    if draw(st.integers(0, 3)) == 0:
        name = f"a{len(anchors)}"
        anchors.append(name)  # defined after its value: `&a [*a]` is a recursive alias
        text = f"&{name} {text}"
    return text


@st.composite
def hostile_documents(draw: st.DrawFn) -> str:
    anchors: list[str] = []
    kind = draw(st.sampled_from(["task", "service", "fleet", "dev-environment"]))
    lines = [f"type: {kind}"]
    for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)):
        lines.append(f"{key}: {draw(hostile_flow(anchors))}")
    return "\n".join(lines) + "\n"


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    """A real config with lines repeated, indented with tabs, or salted with odd characters."""
    lines = draw(st.sampled_from(SEEDS)).splitlines(keepends=True) or ["\n"]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["repeat", "tab", "char", "merge", "tag", "alias"]))
        line = lines[at]
        if action == "repeat":
            lines.insert(draw(st.integers(0, len(lines))), line)
        elif action == "tab":
            lines[at] = "\t" + line.lstrip(" ")
        elif action == "char":
            column = draw(st.integers(0, len(line)))
            lines[at] = line[:column] + draw(st.sampled_from(ODD_CHARS)) + line[column:]
        elif action == "merge":
            indent = line[: len(line) - len(line.lstrip(" "))]
            lines.insert(at, f"{indent}<<: {draw(hostile_flow([]))}\n")
        elif ":" in line:
            key, _, value = line.partition(":")
            if action == "tag":
                lines[at] = f"{key}: {draw(st.sampled_from(TAGS))}{value}"
            else:
                lines[at] = f"{key}: &m{value}"
                lines.append(f"x{at}: *m\n")
    return "".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_documents())
def test_tags_anchors_aliases_and_merge_keys(text: str) -> None:
    check(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_texts())
def test_real_configs_with_repeats_tabs_and_odd_characters(text: str) -> None:
    check(text)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(SEEDS), st.sampled_from(ODD_CHARS), st.data())
def test_an_odd_character_is_reported_on_its_line(
    seed: str, char: str, data: st.DataObject
) -> None:
    if char in "\t\r\x85\u2028":
        return  # blanks and line breaks: often valid where they land
    index = data.draw(st.integers(0, len(seed)))
    text = seed[:index] + char + seed[index:]
    _, issues = load_text(text, "fuzz.dstack.yml")
    line = text.count("\n", 0, index) + 1
    assert [(i.line, i.column) for i in issues] == [(line, index - text.rfind("\n", 0, index))]
