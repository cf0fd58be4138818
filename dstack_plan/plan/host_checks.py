"""Facts about SSH fleets that can be checked without touching a host.

- `shared_host_issues`: a host (hostname and port) belongs to one fleet of the project. Part
  of the limits (`plan/limits.py`): `plan` and `validate` refuse it.
- `local_fact_issues`: every key file a fleet names exists and can be read here. Only `plan`
  (and so `apply`) checks it: `validate` checks the configuration, not the machine it runs on
  (CI, a laptop without the fleet's keys), as `terraform validate` does not read the files a
  configuration names.

A key with a passphrase is not checked for being usable: that needs asking for it, which the
SSH pre-flight does (`providers/ssh/connect.py`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dstack_plan.config.identity_files import identity_path
from dstack_plan.config.loader import issue_at
from dstack_plan.config.resource import STATE_SOURCE, Desired, Resource
from dstack_plan.errors import ConfigIssue

if TYPE_CHECKING:  # imported when a project declares one (they load on first use)
    from dstack_plan.config.fleet import SSHConfig, SSHKey

KeyPath = tuple[str | int, ...]
_HOSTS = ("ssh_config", "hosts")


def _ssh_fleets(desired: Desired) -> Iterator[tuple[Resource, SSHConfig]]:
    for resource in desired.of_kind("fleet"):
        ssh = getattr(resource.spec, "ssh_config", None)
        if ssh is not None:
            yield resource, ssh


def shared_host_issues(desired: Desired, project_dir: str | Path = ".") -> list[ConfigIssue]:
    """A host (hostname and port, `SSHConfig.endpoint`) listed by two fleets: an issue at the
    later fleet's entry (declaration order), naming the fleet and entry that has it first.

    A submission's context fleets (from state) come first: they have their hosts already.
    A host listed twice in one fleet is `limits`' own issue, not reported again here."""
    fleets = list(_ssh_fleets(desired))
    fleets.sort(key=lambda fleet: fleet[0].source.file != STATE_SOURCE)  # stable: in order
    first: dict[tuple[str, int], tuple[Resource, int]] = {}  # endpoint -> fleet, host index
    issues = []
    for resource, ssh in fleets:
        own: set[tuple[str, int]] = set()
        for index, host in enumerate(ssh.hosts):
            endpoint = ssh.endpoint(host)
            if endpoint in own:
                continue
            own.add(endpoint)
            if endpoint not in first:
                first[endpoint] = (resource, index)
                continue
            if resource.source.file == STATE_SOURCE:  # not this submission's to fix
                continue
            holder, holder_index = first[endpoint]
            name, port = endpoint
            message = (
                f"host {name} port {port} is already in {holder.address} "
                f"({_where(holder, holder_index, project_dir)}); a host belongs to one fleet"
            )
            issues.append(issue_at(resource, (*_HOSTS, index), message, project_dir))
    return issues


def _where(resource: Resource, index: int, project_dir: str | Path) -> str:
    if resource.source.file == STATE_SOURCE:
        return "in state"
    at = issue_at(resource, (*_HOSTS, index), "", project_dir)
    return f"{at.file}:{at.line}:{at.column}"


def local_fact_issues(desired: Desired, project_dir: str | Path = ".") -> list[ConfigIssue]:
    """What only this machine can tell about the declared SSH fleets: every `identity_file`
    they name (the fleet's, each host's, each `proxy_jump`'s) is a file the current user can
    read, resolved as the SSH provider resolves it (`config.identity_files.identity_path`).

    An `identity_file` beside an inline private key (`ssh_key.private`, which the provider
    uses instead) is not read, so not checked; one that every host overrides still is, as
    dstack's CLI reads it too. Each problem is located at the value."""
    problems: dict[str, str | None] = {}  # value -> its problem: one look per file
    issues = []
    for resource, ssh in _ssh_fleets(desired):
        if resource.source.file == STATE_SOURCE:  # a submission's context: not applied by it
            continue
        for path, value in _identity_files(ssh):
            if value not in problems:
                problems[value] = identity_file_problem(value)
            problem = problems[value]
            if problem is not None:
                message = f"identity_file {value}{problem}"
                issues.append(issue_at(resource, path, message, project_dir, "value"))
    return issues


def _identity_files(ssh: SSHConfig) -> Iterator[tuple[KeyPath, str]]:
    """Every `identity_file` the fleet names, with its path, but those an inline private key
    replaces (the provider never reads them)."""
    if ssh.identity_file is not None and not _inline(ssh.ssh_key):
        yield ("ssh_config", "identity_file"), ssh.identity_file
    jump = ssh.proxy_jump
    if jump is not None and not _inline(jump.ssh_key):
        yield ("ssh_config", "proxy_jump", "identity_file"), jump.identity_file
    for index, host in enumerate(ssh.hosts):
        # the provider takes the host's key, else the fleet's (`targets_from_config`)
        if host.identity_file is not None and not _inline(host.ssh_key or ssh.ssh_key):
            yield (*_HOSTS, index, "identity_file"), host.identity_file
        jump = host.proxy_jump
        if jump is not None and not _inline(jump.ssh_key):
            yield (*_HOSTS, index, "proxy_jump", "identity_file"), jump.identity_file


def _inline(key: SSHKey | None) -> bool:
    return key is not None and key.private is not None


def identity_file_problem(value: str) -> str | None:
    """Why the key file `value` names cannot be read by the current user (the end of a
    message that starts with `value`), or None when it can. Its content is not checked."""
    path = identity_path(value)
    relative = not (path.is_absolute() or value.startswith("~"))
    shown = f" (looked for {path.absolute()})" if relative else ""
    try:
        mode = path.stat().st_mode
    except PermissionError:
        return f" is not readable (permission denied){shown}"
    except (FileNotFoundError, NotADirectoryError):
        return f": no such file{shown}"
    except OSError as e:
        return f" is not readable ({e.strerror or e}){shown}"
    if stat.S_ISDIR(mode):
        return f" is a directory{shown}"
    if not stat.S_ISREG(mode):  # a FIFO or a device: opening one may block or mean nothing
        return f" is not a regular file{shown}"
    try:
        os.close(os.open(path, os.O_RDONLY))  # opened as the provider will: the true answer
    except PermissionError:
        return f" is not readable (permission denied){shown}"
    except OSError as e:
        return f" is not readable ({e.strerror or e}){shown}"
    return None
