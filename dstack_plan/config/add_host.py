"""`dstack fleet add-host`: add a host to the SSH fleet a project declares, in its file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dstack_plan.config.edit import HostURL, add_ssh_host, parse_host_url
from dstack_plan.config.loader import issue_at, load_project
from dstack_plan.errors import ConfigError, DstackPlanError

if TYPE_CHECKING:
    from dstack_plan.config.fleet import SSHConfig
    from dstack_plan.config.resource import Resource


class HostAdded(NamedTuple):
    """What `add_host` did: the file it edited and the fleet before and after."""

    file: str
    """As the loader shows it (relative to the project directory when inside it)."""
    entry: dict[str, Any]
    """The host entry written: `hostname`, then what differs from `ssh_config`."""
    before: Resource
    after: Resource


def add_host(
    directory: str | Path,
    files: Sequence[str],
    fleet: str,
    url: str,
    identity_file: str | None = None,
) -> HostAdded:
    """Add the host `url` (`ssh://USER@HOST[:PORT]`) to `ssh_config.hosts` of `fleet.<fleet>`,
    in the file and document that declare it (among `files`, else the project's files).

    Refuses (DstackPlanError) a malformed URL, a fleet that is not declared or not an SSH
    fleet, a host without a user, and a host already listed (same hostname and port; a
    ConfigError located at the entry that lists it). The file is rewritten atomically and
    loaded again; if it would not load, it is left as it was.
    """
    host = parse_host_url(url)
    address = f"fleet.{fleet}"
    desired = load_project(directory, files)
    resource = desired.resources.get(address)
    if resource is None:
        declared = ", ".join(r.address for r in desired.of_kind("fleet")) or "none"
        where = ", ".join(files) if files else f"the project in {directory}"
        raise DstackPlanError(f"{address} is not declared in {where} (fleets: {declared})")
    ssh = getattr(resource.spec, "ssh_config", None)
    if ssh is None:
        raise DstackPlanError(
            f"{address} ({resource.source}) is not an SSH fleet: add-host adds hosts to fleets "
            "with ssh_config"
        )
    if resource.source.file == "<stdin>":
        raise DstackPlanError(f"{address} was read from stdin: give its file with --file")
    _refuse_listed(resource, ssh, host, directory)
    entry = _entry(ssh, host, identity_file, address)
    path = Path(directory, resource.source.file)
    original = path.read_bytes().decode("utf-8")  # as it is: no newline translation
    _write(path, add_ssh_host(original, resource.source.document, entry))
    try:
        after = load_project(directory, files).resources[address]
    except BaseException:
        _write(path, original)  # never leave a file that no longer loads
        raise
    return HostAdded(resource.source.file, entry, resource, after)


def _refuse_listed(
    resource: Resource, ssh: SSHConfig, host: HostURL, directory: str | Path
) -> None:
    wanted = (host.hostname, host.port or ssh.port)
    for index, listed in enumerate(ssh.hosts):
        if ssh.endpoint(listed) == wanted:
            path = ("ssh_config", "hosts", index)
            message = (
                f"host {host.hostname} port {wanted[1]} is already listed in {resource.address}"
            )
            raise ConfigError([issue_at(resource, path, message, directory, "value")])


def _entry(
    ssh: SSHConfig, host: HostURL, identity_file: str | None, address: str
) -> dict[str, Any]:
    """The host's entry: what it does not inherit from `ssh_config` (user, port, key)."""
    if host.user is None and ssh.user is None:
        raise DstackPlanError(
            f"no user for {host.hostname}: give ssh://USER@{host.hostname} or set "
            f"ssh_config.user in {address}"
        )
    entry: dict[str, Any] = {"hostname": host.hostname}
    if host.port is not None and host.port != ssh.port:
        entry["port"] = host.port
    if host.user is not None and host.user != ssh.user:
        entry["user"] = host.user
    if identity_file is not None and identity_file != ssh.identity_file:
        entry["identity_file"] = identity_file
    return entry


def _write(path: Path, text: str) -> None:
    """Replace `path`'s content atomically, keeping its permissions."""
    mode = path.stat().st_mode & 0o7777
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
