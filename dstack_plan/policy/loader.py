"""Finding and reading policy files: `--policy FILE` and the project's `.dstack/policies/`.

A policy file is YAML, one document, located errors (FILE:LINE:COL) like a configuration's::

    rules:
      - name: max-gpus
        expression: "runs.all(r, r.gpus <= 8)"
        message: "a run asks for more than 8 GPUs"
        severity: deny      # or warn
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dstack_plan.config.settings_file import read_mapping
from dstack_plan.errors import ConfigError, ConfigIssue
from dstack_plan.policy.model import LoadedRule, PolicyFile, Where

POLICY_DIR = ".dstack/policies"


def policy_paths(project_dir: str | Path, explicit: Iterable[str] = ()) -> list[tuple[Path, str]]:
    """(path, display name) of every policy file: those given (in order, as named), then the
    project's `.dstack/policies/*.yml` / `*.yaml` (sorted); each file once."""
    found: list[tuple[Path, str]] = [(Path(p), p) for p in explicit]
    folder = Path(project_dir) / POLICY_DIR
    if folder.is_dir():
        names = sorted(p.name for p in folder.iterdir() if p.suffix in (".yml", ".yaml"))
        found += [(folder / n, f"{POLICY_DIR}/{n}") for n in names]
    seen: set[Path] = set()
    unique = []
    for path, display in found:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append((path, display))
    return unique


def load_rules(files: Sequence[tuple[Path, str]]) -> list[LoadedRule]:
    """The rules of `files` ((path, display name) pairs); ConfigError locating every problem
    of every file (FILE:LINE:COL)."""
    rules: list[LoadedRule] = []
    issues: list[ConfigIssue] = []
    for path, display in files:
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as e:
            issues.append(ConfigIssue(display, 1, 1, f"cannot read policy file: {e.strerror}"))
            continue
        try:
            rules += parse_rules(text, display)
        except ConfigError as e:
            issues += e.issues
    if issues:
        raise ConfigError(issues)
    return rules


def parse_rules(text: str, display: str) -> list[LoadedRule]:
    """The rules of one policy file's `text`; ConfigError as `load_rules`."""
    document = read_mapping(text, display, "rules", required=True)
    assert document is not None  # required: a file with no document is an error
    policy = document.validate(PolicyFile)
    node, issues = document.node, document.issues
    items = _rule_nodes(node)
    loaded = []
    seen: dict[str, int] = {}
    for index, rule in enumerate(policy.rules):
        item = items[index]
        if rule.name in seen:
            line, column = _start(_value(item, "name"))
            issues.append(ConfigIssue(display, line, column, f"duplicate rule name {rule.name!r}"))
        seen[rule.name] = index
        loaded.append(LoadedRule(rule, display, _where(_value(item, "expression"), text)))
    if issues:
        raise ConfigError(issues)
    return loaded


def _rule_nodes(node: Any) -> list[Any]:
    rules = _value(node, "rules")
    return list(rules.value)


def _value(mapping: Any, key: str) -> Any:
    for k, v in mapping.value:
        if k.value == key:
            return v
    raise KeyError(key)  # validated: the key is there


def _start(node: Any) -> tuple[int, int]:
    return int(node.start_mark.line) + 1, int(node.start_mark.column) + 1


def _where(node: Any, text: str) -> Where:
    line, column = _start(node)
    style = getattr(node, "style", None)
    if style in ("|", ">"):
        lines = text.splitlines()
        for number in range(line, len(lines)):  # the first content line after the indicator
            content = lines[number]
            if content.strip():
                return Where(number + 1, len(content) - len(content.lstrip()) + 1, True)
        return Where(line + 1, 1, True)
    if style in ("'", '"'):
        return Where(line, column + 1, False)
    return Where(line, column, False)
