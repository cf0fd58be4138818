"""The one error hierarchy. The CLI prints any DstackPlanError as a message and exits 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """`text` safe to print on a terminal and to parse one message a line: control
    characters (C0, DEL, C1), line and paragraph separators and bidirectional overrides
    escaped as `\\n`, `\\x85`, `\\u202e`; with `keep_newlines`, the newlines that separate the
    lines of a message stay."""
    if text.isascii() and text.isprintable():
        return text  # the common case, at once
    out = []
    for char in text:
        if char == "\n" and keep_newlines:
            out.append(char)
        elif char in _BIDI or char in "\u2028\u2029" or not (char.isprintable() or char == "\t"):
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return "".join(out)


class DstackPlanError(Exception):
    """Base of every error a user can cause; never a bug."""


class ConfigIssue(NamedTuple):
    """One problem in a configuration file, pointing at the offending key or value."""

    file: str
    line: int
    """1-based line."""
    column: int
    """1-based column."""
    message: str

    def __str__(self) -> str:
        # one issue a line, whatever the file's name or the message quotes of the input
        return f"{shown(self.file)}:{self.line}:{self.column}: error: {shown(self.message)}"


class ConfigError(DstackPlanError):
    """One or more problems in configuration files, each with file, line and column."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = sorted(issues, key=lambda i: (i.file, i.line, i.column, i.message))
        super().__init__("\n".join(str(i) for i in self.issues))

    @classmethod
    def at(cls, file: str | Path, line: int, column: int, message: str) -> ConfigError:
        return cls([ConfigIssue(str(file), line, column, message)])


class PlanError(DstackPlanError):
    """The plan cannot be made or applied (stale plan, prevent_destroy, cycle...)."""


class StateError(DstackPlanError):
    """The state cannot be read or written consistently."""


class LockError(StateError):
    """The operation lock is held by someone else."""

    def __init__(self, message: str, holder: object | None = None):
        self.holder = holder
        super().__init__(message)


class ProviderError(DstackPlanError):
    """A provider failed for a resource."""

    def __init__(self, provider: str, message: str, resource: str | None = None):
        self.provider = provider
        self.resource = resource
        self.detail = message  # without provider and resource, for reports that name both
        where = f"{provider}: {resource}" if resource else provider
        super().__init__(f"{where}: {message}")


class AgentError(DstackPlanError):
    """The host agent answered with an error or could not be reached."""

    def __init__(
        self,
        host: str,
        message: str,
        status: int | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ):
        self.host = host
        self.status = status
        self.code = code
        """The agent's error code (`claimed`, `not_found`, ...), when it answered one."""
        self.details = details
        """What else the agent said about the error (a claimed host's owner)."""
        self.detail = message
        super().__init__(f"{host}: {message}")


class SSHError(DstackPlanError):
    """An SSH host could not be reached, refused the login, or failed a pre-flight check."""

    def __init__(self, host: str, message: str):
        self.host = host
        self.detail = message
        super().__init__(f"{host}: {message}")


class HostKeyChangedError(SSHError):
    """A host presented a key other than the pinned (or known_hosts) one."""

    def __init__(self, host: str, expected: str, got: str, source: str):
        self.expected = expected
        self.got = got
        super().__init__(
            host,
            "WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! The host key is "
            f"{got}, but {source} has {expected}. Someone could be intercepting the "
            "connection, or the host was reinstalled. If you expect the change, re-trust "
            "it explicitly (`dstack fleet trust FLEET HOST`).",
        )
