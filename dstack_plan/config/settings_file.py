"""Reading the small YAML settings files of a project (`.dstack/backend.yml`,
`.dstack/backends.yml`, `.dstack/quotas.yml`, policy files): their one mapping, checked
against a model, with every problem located like a config's (FILE:LINE:COL)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from dstack_plan.config import yaml_errors, yaml_fast
from dstack_plan.config.validation_errors import PendingIssue, issues_from_validation
from dstack_plan.config.yaml_limits import MAX_ISSUES, shorten
from dstack_plan.errors import ConfigError, ConfigIssue

M = TypeVar("M", bound=BaseModel)


def read_documents(text: str, display: str) -> tuple[list[tuple[Any, Any]], list[ConfigIssue]]:
    """The non-empty documents of `text` as (node, data), and the duplicate keys found.

    ConfigError, at `display`'s line and column, when `text` is not YAML."""
    reader = yaml_fast.Documents(text)
    try:
        documents = [(node, data) for node, data in reader if data is not None]
    except yaml.YAMLError as e:
        raise ConfigError([yaml_errors.yaml_issue(e, display, text)]) from None
    except UnicodeEncodeError as e:
        raise ConfigError([yaml_errors.encoding_issue(e, display, text)]) from None
    except (ValueError, RecursionError) as e:
        raise ConfigError.at(display, 1, 1, f"cannot parse YAML: {shorten(str(e))}") from None
    return documents, [yaml_errors.yaml_issue(d, display, text) for d in reader.duplicates]


@dataclass
class SettingsDocument:
    """The one mapping a settings file holds, with the problems found so far.

    `validate` checks it against a model and raises every problem, located at FILE:LINE:COL;
    `locate` places problems found by other checks the same way."""

    text: str
    display: str
    node: Any
    data: dict[str, Any]
    issues: list[ConfigIssue] = field(default_factory=list)

    def validate(
        self,
        model: type[M],
        found: Callable[[ValidationError], list[PendingIssue]] | None = None,
        target_of: Callable[[PendingIssue], Any] | None = None,
    ) -> M:
        """`data` as `model`; ConfigError with every problem when it is not one.

        `found` turns pydantic's error into the problems to report (default: one per error);
        `target_of` says whether each is about a key or its value (default: the issue's)."""
        try:
            return model.model_validate(self.data)
        except ValidationError as e:
            pending = (
                found(e)
                if found is not None
                else list(issues_from_validation(e, 0, self.data, model, 20 * MAX_ISSUES))
            )
            self.issues.extend(self.locate(pending[:MAX_ISSUES], target_of))
            raise ConfigError(self.issues) from None

    def locate(
        self,
        pending: Iterable[PendingIssue],
        target_of: Callable[[PendingIssue], Any] | None = None,
    ) -> list[ConfigIssue]:
        """`pending` as issues at their line and column in the file."""
        from dstack_plan.config.locate import Locator  # noqa: PLC0415 - only on errors

        locator = Locator(self.text, {0: self.node})
        located = []
        for issue in pending:
            target = target_of(issue) if target_of is not None else issue.target
            pos = locator.find(0, issue.path, target)
            located.append(
                ConfigIssue(self.display, pos.line, pos.column, shorten(issue.message, 500))
            )
        return located

    def raise_issues(self) -> None:
        """ConfigError when any problem was found."""
        if self.issues:
            raise ConfigError(self.issues)


def read_mapping(text: str, display: str, key: str, *, required: bool) -> SettingsDocument | None:
    """The single mapping document of `text`, which should hold `key`.

    None when `text` holds no document and that is allowed (`required=False`); ConfigError
    when it is not YAML, holds several documents or is not a mapping."""
    documents, issues = read_documents(text, display)
    if not documents:
        if required:
            issues.append(ConfigIssue(display, 1, 1, "expected one YAML document, got none"))
        if issues:
            raise ConfigError(issues)
        return None
    if len(documents) > 1:
        issues.append(ConfigIssue(display, 1, 1, "expected one YAML document, got several"))
    node, data = documents[0]
    if not isinstance(data, dict):
        issues.append(ConfigIssue(display, 1, 1, f"expected a mapping with a {key!r} key"))
        raise ConfigError(issues)
    return SettingsDocument(text, display, node, data, issues)


def read_settings_text(project_dir: str | Path, relative: str) -> str | None:
    """The text of the project's settings file `relative` (`.dstack/quotas.yml`...); None
    when there is none; ConfigError at `relative`:1:1 when it cannot be read."""
    try:
        return (Path(project_dir) / relative).read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError.at(relative, 1, 1, f"cannot read file: {e.strerror or e}") from None
