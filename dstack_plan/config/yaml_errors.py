"""Turn what the YAML parser raises into located issues a user can act on.

libyaml reports bad characters as a byte offset and tabs as "a character that cannot start any
token"; this says where and what, in the file's own lines and columns.
"""

from __future__ import annotations

import yaml

from dstack_plan.config.yaml_fast import C_LOADER
from dstack_plan.config.yaml_limits import DuplicateKeyError, LimitError, shorten
from dstack_plan.errors import ConfigIssue

TAB_MESSAGE = "tabs are not allowed for indentation in YAML"


def yaml_issue(error: yaml.YAMLError, display: str, text: str) -> ConfigIssue:
    """The issue for a YAML error raised while loading `text`."""
    if isinstance(error, yaml.reader.ReaderError):
        return _reader_issue(error, display, text)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    message = shorten(f"invalid YAML: {problem}" + (f" ({context})" if context else ""), 400)
    if isinstance(error, DuplicateKeyError | LimitError):
        message = str(problem)  # not a syntax error: say just what is wrong
    if mark is None:
        return ConfigIssue(display, 1, 1, message)
    index = getattr(mark, "index", -1)
    if 0 <= index < len(text) and text[index] == "\t" and _indentation(text, index):
        message = TAB_MESSAGE
    return ConfigIssue(display, int(mark.line) + 1, int(mark.column) + 1, message)


def encoding_issue(error: UnicodeEncodeError, display: str, text: str) -> ConfigIssue:
    """A lone surrogate in `text`: an undecodable byte (read with surrogateescape) or worse."""
    char = ord(text[error.start])
    if 0xDC80 <= char <= 0xDCFF:
        message = f"not UTF-8 text: invalid byte 0x{char - 0xDC00:02X}"
    else:
        message = f"invalid character U+{char:04X} (a lone surrogate)"
    line, column = position(text, error.start)
    return ConfigIssue(display, line, column, message)


def position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character `index` of `text`."""
    line_start = text.rfind("\n", 0, index) + 1
    return text.count("\n", 0, index) + 1, index - line_start + 1


def _reader_issue(error: yaml.reader.ReaderError, display: str, text: str) -> ConfigIssue:
    index = error.position
    if C_LOADER:  # libyaml counts bytes of the UTF-8 encoding
        index = len(text.encode("utf-8", "surrogateescape")[:index].decode("utf-8", "ignore"))
    char = error.character if isinstance(error.character, int) else ord(error.character)
    kind = str(error.reason).split()[0]  # "control characters are not allowed" -> "control"
    line, column = position(text, min(index, len(text)))
    message = f"invalid YAML: {kind} character U+{char:04X} is not allowed"
    return ConfigIssue(display, line, column, message)


def _indentation(text: str, index: int) -> bool:
    """Whether only blanks precede `index` on its line."""
    line_start = text.rfind("\n", 0, index) + 1
    return not text[line_start:index].strip(" \t")
