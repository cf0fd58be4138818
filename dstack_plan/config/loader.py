"""Load a project's configuration files into `Desired`, reporting every problem with a location."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from dstack_plan.config import interpolation, yaml_fast
from dstack_plan.config.kinds import KINDS, spec_class
from dstack_plan.config.resource import Desired, Resource, Source
from dstack_plan.config.validation_errors import PendingIssue, issues_from_validation
from dstack_plan.errors import ConfigError, ConfigIssue
from dstack_plan.forkmap import ForkedMap, fork_start
from dstack_plan.gcpause import gc_paused

if TYPE_CHECKING:
    from dstack_plan.config.locate import Locator

_SKIP_DIRS = {
    ".git", ".hg", ".svn", ".dstack", ".venv", "venv", "node_modules", "__pycache__",
    ".tox", ".nox", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
}  # fmt: skip
_CONFIG_SUFFIXES = (".dstack.yml", ".dstack.yaml")
_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9]+")
STDIN = "-"
PARALLEL_LOAD_BYTES = 128 * 1024
"""Below this much YAML in all, loading on other cores costs more than it saves."""


def discover(directory: Path) -> list[Path]:
    """Every configuration file below `directory`, sorted, skipping VCS, state and virtualenvs."""
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(
            d for d in dirs if d not in _SKIP_DIRS and not (Path(root, d, "pyvenv.cfg").exists())
        )
        found.extend(Path(root, f) for f in sorted(files) if _is_config_file(f))
    return found


def _is_config_file(filename: str) -> bool:
    return filename in (".dstack.yml", ".dstack.yaml") or (
        filename.endswith(_CONFIG_SUFFIXES) and not filename.startswith(".")
    )


def load_project(
    directory: str | Path = ".", files: Sequence[str | Path] = (), stdin: str | None = None
) -> Desired:
    """Load the files given (`-` is stdin) or, when none are, every config file in `directory`.

    Raises ConfigError carrying every problem found in every file.
    """
    with gc_paused():
        return start_loading(directory, files, stdin).finish()


def start_loading(
    directory: str | Path = ".",
    files: Sequence[str | Path] = (),
    stdin: str | None = None,
    *,
    busy: int = 0,
    normalize: bool = False,
) -> PendingLoad:
    """`load_project` in two steps: read the files and start parsing them on the other cores;
    `finish()` parses this process's share and gathers the rest.

    `busy` is what the caller will do between the two steps, in bytes of YAML it would take as
    long to load (see `forkmap.fork_start`). With `normalize`, every resource's `normalized`
    form is computed as it is parsed (planning needs it). Raises ConfigError only for a
    missing directory.
    """
    base = Path(directory)
    if files:
        paths: list[Path | str] = [STDIN if str(f) == STDIN else Path(f) for f in files]
    else:
        if not base.is_dir():
            raise ConfigError.at(base, 1, 1, "not a directory")
        paths = list(discover(base))
    read: list[tuple[str, str] | ConfigIssue] = []
    for path in paths:
        display = "<stdin>" if path == STDIN else _display_path(Path(path), base)
        try:
            read.append((display, _read(path, stdin)))
        except OSError as e:
            read.append(ConfigIssue(display, 1, 1, f"cannot read file: {e.strerror or e}"))
    texts = [entry for entry in read if not isinstance(entry, ConfigIssue)]
    weights = [len(text) for _, text in texts]
    load = partial(_load_file, normalize=normalize)
    parsing = fork_start(load, texts, weights, min_weight=PARALLEL_LOAD_BYTES, busy=busy)
    return PendingLoad(read, parsing, lambda d: _text_of(d, paths, base, stdin))


class PendingLoad:
    """Files read, their parsing under way (see `start_loading`)."""

    def __init__(
        self,
        read: list[tuple[str, str] | ConfigIssue],
        parsing: ForkedMap[tuple[str, str], tuple[list[Resource], list[ConfigIssue]]],
        text_of: Callable[[str], str],
    ):
        self._read = read
        self._parsing = parsing
        self._text_of = text_of

    def finish(self) -> Desired:
        """Every declared resource; ConfigError carrying every problem of every file."""
        results = iter(self._parsing.results())
        loaded: list[Resource] = []
        issues: list[ConfigIssue] = []
        for entry in self._read:
            if isinstance(entry, ConfigIssue):
                resources, file_issues = [], [entry]
            else:
                resources, file_issues = next(results)
            loaded.extend(resources)
            issues.extend(file_issues)
        desired, duplicate_issues = _index(loaded, self._text_of)
        issues.extend(duplicate_issues)
        if issues:
            raise ConfigError(issues)
        return Desired(resources=desired, files=tuple(sorted({r.source.file for r in loaded})))

    def cancel(self) -> None:
        """Give up (the caller failed meanwhile): stop the parsing children."""
        self._parsing.cancel()


def load_text(
    text: str, display: str, name_hint: str = "config"
) -> tuple[list[Resource], list[ConfigIssue]]:
    """Parse one file's text. Returns its resources and its problems (all of them)."""
    try:
        documents = yaml_fast.load_all(text)
    except yaml.YAMLError as e:
        return [], [_yaml_issue(e, display)]
    except (ValueError, RecursionError) as e:
        return [], [ConfigIssue(display, 1, 1, f"cannot parse YAML: {e}")]
    resources: list[Resource] = []
    pending: list[PendingIssue] = []
    unnamed = [i for i, d in enumerate(documents) if isinstance(d, dict) and "name" not in d]
    # A string holds `${{` only if the text does, or spells it with an escape sequence.
    may_reference = "${{" in text or "\\" in text
    for index, data in enumerate(documents):
        if data is None:
            continue
        derived = f"{name_hint}-{index}" if len(unnamed) > 1 else name_hint
        resource = _build(data, index, display, derived[:41].rstrip("-"), pending, may_reference)
        if resource is not None:
            resources.append(resource)
    if not pending:
        return resources, []
    from dstack_plan.config.locate import Locator

    locator = Locator(text)
    return resources, [_locate(p, display, locator) for p in pending]


def _load_file(
    file: tuple[str, str], normalize: bool = False
) -> tuple[list[Resource], list[ConfigIssue]]:
    """`load_text` for one `(display name, text)` pair; what `fork_map` runs on other cores."""
    display, text = file
    resources, issues = load_text(text, display, name_hint=_name_hint(display))
    if normalize and not issues:
        for resource in resources:
            resource.normalized  # noqa: B018 - computed here, where the file is parsed
    return resources, issues


def _build(
    data: Any,
    index: int,
    display: str,
    derived_name: str,
    pending: list[PendingIssue],
    may_reference: bool = True,
) -> Resource | None:
    if not isinstance(data, dict):
        pending.append(PendingIssue(index, (), "expected a mapping with a 'type' key"))
        return None
    kind = data.get("type")
    known = ", ".join(KINDS)
    if kind is None:
        pending.append(PendingIssue(index, (), f"missing required key 'type' (one of: {known})"))
        return None
    if not isinstance(kind, str) or kind not in KINDS:
        pending.append(PendingIssue(index, ("type",), f"unknown type {kind!r} (one of: {known})"))
        return None
    model = spec_class(kind)
    before = len(pending)
    if may_reference:
        for path, message in interpolation.scan(data):
            pending.append(PendingIssue(index, path, message))
    try:
        spec = model.model_validate(data)
    except ValidationError as e:
        pending.extend(issues_from_validation(e, index, data, model))
        return None
    except (TypeError, ValueError, RecursionError) as e:  # e.g. unhashable YAML keys
        pending.append(PendingIssue(index, (), f"invalid document: {e}"))
        return None
    if len(pending) > before:
        return None
    name = spec.name or derived_name
    return Resource(
        kind,
        name,
        spec,
        Source(display, index),
        name_derived=spec.name is None,
        may_reference=may_reference,
    )


def _index(
    resources: Iterable[Resource], text_of: Callable[[str], str]
) -> tuple[dict[str, Resource], list[ConfigIssue]]:
    by_address: dict[str, Resource] = {}
    issues: list[ConfigIssue] = []
    locators: dict[str, Locator] = {}
    for resource in resources:
        first = by_address.get(resource.address)
        if first is None:
            by_address[resource.address] = resource
            continue
        from dstack_plan.config.locate import Locator

        def where(r: Resource) -> str:
            locator = locators.get(r.source.file) or locators.setdefault(
                r.source.file, Locator(text_of(r.source.file))
            )
            pos = (
                locator.document_start(r.source.document)
                if r.name_derived
                else locator.find(r.source.document, ("name",))
            )
            return f"{r.source.file}:{pos.line}:{pos.column}"

        here = where(resource)
        file, line, column = here.rsplit(":", 2)
        issues.append(
            ConfigIssue(
                file,
                int(line),
                int(column),
                f"duplicate resource {resource.address}: already defined at {where(first)}",
            )
        )
    return by_address, issues


def _text_of(display: str, paths: Sequence[Path | str], base: Path, stdin: str | None) -> str:
    """Re-read one file by its display name; only needed to locate duplicate resources."""
    for path in paths:
        shown = "<stdin>" if path == STDIN else _display_path(Path(path), base)
        if shown == display:
            try:
                return _read(path, stdin)
            except OSError:
                return ""
    return ""


_stdin_cache: dict[str, str] = {}


def _read(path: Path | str, stdin: str | None) -> str:
    if path == STDIN:
        if stdin is not None:
            return stdin
        if "text" not in _stdin_cache:
            _stdin_cache["text"] = sys.stdin.read()
        return _stdin_cache["text"]
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise OSError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise OSError("is a directory") from None


def _display_path(path: Path, base: Path) -> str:
    """Relative to the project directory when inside it, else to the working directory."""
    absolute = os.path.abspath(path)
    for root in (os.path.abspath(base), os.getcwd()):
        relative = os.path.relpath(absolute, root)
        if not relative.startswith(".." + os.sep) and relative != "..":
            return relative
    return str(path)


def _name_hint(display: str) -> str:
    """A stable resource name for a document without `name:`, derived from its file path.

    `train.dstack.yml` gives `train`, `llm/.dstack.yml` gives `llm`; long paths are shortened
    with a hash so the name stays unique and valid.
    """
    path = Path(display)
    stem = path.name
    for suffix in _CONFIG_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    parts = [p for p in path.parent.parts if p not in (".", "..", "/")]
    if stem:
        parts.append(stem)
    if not parts:
        parts = [Path.cwd().name]
    name = _INVALID_NAME_CHARS.sub("-", "-".join(parts).lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"config-{name}".rstrip("-")
    if len(name) > 36:
        digest = hashlib.sha1(name.encode()).hexdigest()[:6]
        name = f"{name[-29:].strip('-')}-{digest}"
        if not name[0].isalpha():
            name = "c" + name[1:]
    return name


def _yaml_issue(error: yaml.YAMLError, display: str) -> ConfigIssue:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    message = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
    if mark is None:
        return ConfigIssue(display, 1, 1, message)
    return ConfigIssue(display, mark.line + 1, mark.column + 1, message)


def _locate(issue: PendingIssue, display: str, locator: Locator) -> ConfigIssue:
    pos = locator.find(issue.document, issue.path, issue.target)
    return ConfigIssue(display, pos.line, pos.column, issue.message)


def issue_at(
    resource: Resource, path: tuple[str | int, ...], message: str, project_dir: str | Path = "."
) -> ConfigIssue:
    """A located issue about a loaded resource (for checks made after loading)."""
    display = resource.source.file
    try:
        text = _read(STDIN if display == "<stdin>" else Path(project_dir, display), None)
    except OSError:
        text = ""
    from dstack_plan.config.locate import Locator

    pos = Locator(text).find(resource.source.document, path, "key")
    return ConfigIssue(display, pos.line, pos.column, message)
