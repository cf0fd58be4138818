"""Load a project's configuration files into `Desired`, reporting every problem with a location."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import count, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import ValidationError

from dstack_plan.config import interpolation, yaml_errors, yaml_fast
from dstack_plan.config.discover import CONFIG_SUFFIXES, discover
from dstack_plan.config.forkmap import ForkedMap, fork_start
from dstack_plan.config.gcpause import gc_paused
from dstack_plan.config.kinds import KINDS, spec_class
from dstack_plan.config.resource import Desired, Resource, Source
from dstack_plan.config.validation_errors import PendingIssue, issues_from_validation
from dstack_plan.config.yaml_limits import MAX_ISSUES, shorten
from dstack_plan.errors import ConfigError, ConfigIssue

if TYPE_CHECKING:
    from dstack_plan.config.locate import Locator

_CONFIG_SUFFIXES = CONFIG_SUFFIXES
logger = logging.getLogger(__name__)
_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9]+")
STDIN = "-"
MESSAGE_LIMIT = 500
"""Longest error message, in characters, before it is cut (values can be megabytes)."""
PARALLEL_LOAD_BYTES = 128 * 1024
"""Below this much YAML in all, loading on other cores costs more than it saves."""
STATE_BYTES_PER_CONFIG_BYTE = 40
"""Reading a byte of state takes about a fortieth of the time loading (parsing, validating,
normalising, and handing back from another core) a byte of YAML configuration does: for
10,000 resources, 20 MB of state in 0.5 s, 3 MB of YAML in 2.3 s on two busy cores. This
process reads the state while the others parse, so it takes a smaller share of the YAML."""


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
    busy_state_bytes: int = 0,
    normalize: bool = False,
) -> PendingLoad:
    """`load_project` in two steps: read the files and start parsing them on the other cores;
    `finish()` parses this process's share and gathers the rest.

    `busy_state_bytes` is the size of the state file the caller reads between the two steps
    (this process then parses a smaller share: `config/forkmap.py`'s `fork_start`). With
    `normalize`, every resource's `normalized` form is computed as it is parsed (planning
    needs it). Raises ConfigError only for a missing directory.
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
    parsing = fork_start(
        load,
        texts,
        weights,
        min_weight=PARALLEL_LOAD_BYTES,
        busy=busy_state_bytes // STATE_BYTES_PER_CONFIG_BYTE,
    )
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
                issues.append(entry)
                continue
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
    """Parse one file's text. Returns its resources and its problems (all of them, up to
    MAX_ISSUES)."""
    with gc_paused():  # a no-op inside load_project, which pauses it already
        return _load_text(text, display, name_hint)


def load_mapping(data: Mapping[str, Any], display: str) -> tuple[Resource | None, list[str]]:
    """One configuration given as a mapping rather than YAML (the Python SDK's builders),
    validated as a document of a file is, by the same models: the resource, or the problems,
    each message starting with its field path (`resources.memory: invalid ...`)."""
    pending: list[PendingIssue] = []
    resource = _build(dict(data), 0, display, "sdk", pending)
    return resource, [shorten(p.message, MESSAGE_LIMIT) for p in pending]


def _load_text(
    text: str, display: str, name_hint: str
) -> tuple[list[Resource], list[ConfigIssue]]:
    reader = yaml_fast.Documents(text)
    documents = iter(reader)
    built: list[Resource] = []
    pending: list[PendingIssue] = []
    nodes: dict[int, Any] = {}  # the nodes of documents with problems, to locate them
    unnamed = 0
    # A string holds `${{` only if the text does, or spells it with an escape sequence.
    may_reference = "${{" in text or "\\" in text
    for index in count():
        try:
            node, data = next(documents)
        except StopIteration:
            break
        except yaml.YAMLError as e:
            return [], [_yaml_issue(e, display, text)]
        except UnicodeEncodeError as e:  # undecodable bytes, read as lone surrogates
            return [], [yaml_errors.encoding_issue(e, display, text)]
        except (ValueError, RecursionError) as e:
            return [], [ConfigIssue(display, 1, 1, f"cannot parse YAML: {shorten(str(e))}")]
        if data is None:
            continue
        unnamed += isinstance(data, dict) and "name" not in data
        before = len(pending)
        resource = _build(data, index, display, name_hint[:41].rstrip("-"), pending, may_reference)
        if resource is not None:
            built.append(resource)
        if len(pending) > before:
            nodes[index] = node
    if unnamed > 1:  # several documents without a name: number them
        built = [_numbered(r, name_hint) if r.name_derived else r for r in built]
    found = [_yaml_issue(d, display, text) for d in reader.duplicates]
    if not pending:
        return built, _at_most(found, [])
    from dstack_plan.config.locate import Locator

    locator = Locator(text, nodes)
    room = max(0, MAX_ISSUES + 1 - len(found))
    located = [_locate(p, display, locator) for p in pending[:room]]
    return built, _at_most(found, located)


def _numbered(resource: Resource, name_hint: str) -> Resource:
    name = f"{name_hint}-{resource.source.document}"[:41].rstrip("-")
    return dataclasses.replace(resource, name=name)


def _at_most(*groups: list[ConfigIssue]) -> list[ConfigIssue]:
    """The first MAX_ISSUES issues; then one more saying that there are more."""
    issues = [issue for group in groups for issue in group]
    if len(issues) <= MAX_ISSUES:
        return issues
    extra = issues[MAX_ISSUES]
    note = f"more problems in this file (only the first {MAX_ISSUES} are reported)"
    return [*issues[:MAX_ISSUES], extra._replace(message=note)]


def _load_file(
    file: tuple[str, str], normalize: bool = False
) -> tuple[list[Resource], list[ConfigIssue]]:
    """`load_text` for one `(display name, text)` pair; what `fork_map` runs on other cores."""
    display, text = file
    try:
        resources, issues = load_text(text, display, name_hint=_name_hint(display))
    except Exception as e:  # noqa: BLE001 - a bug in one file's checks must not hide the others'
        logger.debug("loading %s failed", display, exc_info=True)
        message = f"internal error while loading this file (a bug): {type(e).__name__}: {e}"
        return [], [ConfigIssue(display, 1, 1, shorten(message))]
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
    # Room for one issue past the file's limit, so that load_text can tell there are more.
    room = max(0, MAX_ISSUES + 1 - len(pending))
    if may_reference:
        for path, message in islice(interpolation.scan(data), room):
            pending.append(PendingIssue(index, path, message))
    try:
        spec = model.model_validate(data)
    except ValidationError as e:
        room = max(0, MAX_ISSUES + 1 - len(pending))
        pending.extend(islice(issues_from_validation(e, index, data, model, _RAW_ERRORS), room))
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


_RAW_ERRORS = 20 * MAX_ISSUES
"""Pydantic errors read per document: a union reports one per alternative, and at most
MAX_ISSUES are shown, so turning a quarter of a million of them into messages is wasted time."""


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
            buffer = getattr(sys.stdin, "buffer", None)
            _stdin_cache["text"] = (
                buffer.read().decode("utf-8", "surrogateescape") if buffer else sys.stdin.read()
            )
        return _stdin_cache["text"]
    try:
        # Bytes that are not UTF-8 become lone surrogates, which the YAML parser then reports
        # at their own line and column (see yaml_errors.encoding_issue).
        return Path(path).read_text(encoding="utf-8", errors="surrogateescape")
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


def _yaml_issue(error: yaml.YAMLError, display: str, text: str = "") -> ConfigIssue:
    return yaml_errors.yaml_issue(error, display, text)


def _locate(issue: PendingIssue, display: str, locator: Locator) -> ConfigIssue:
    pos = locator.find(issue.document, issue.path, issue.target)
    # A message may quote a value of any size (a megabyte string, an expanded alias).
    return ConfigIssue(display, pos.line, pos.column, shorten(issue.message, MESSAGE_LIMIT))


def issue_at(
    resource: Resource,
    path: tuple[str | int, ...],
    message: str,
    project_dir: str | Path = ".",
    target: Literal["key", "value"] = "key",
) -> ConfigIssue:
    """A located issue about a loaded resource (for checks made after loading), at the key
    at `path` (or its value: where a load error about a bad value would point)."""
    display = resource.source.file
    file = STDIN if display == "<stdin>" else str(Path(project_dir, display))
    try:
        stat = os.stat(file) if file != STDIN else None
    except OSError:
        stat = None
    version = (stat.st_mtime_ns, stat.st_size) if stat else (0, 0)
    pos = _file_locator(file, version).find(resource.source.document, path, target)
    return ConfigIssue(display, pos.line, pos.column, message)


@functools.lru_cache(maxsize=2)
def _file_locator(file: str, version: tuple[int, int]) -> Locator:
    """One locator per file (and version of it): checks after loading may report thousands of
    issues in one file, and composing it again for each would take minutes."""
    try:
        text = _read(file, None)
    except OSError:
        text = ""
    from dstack_plan.config.locate import Locator

    return Locator(text)
