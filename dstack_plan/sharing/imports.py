"""Another project's fleet, as this project's runs use it: `fleets: [platform/gpu]`; and its
gateway, as this project's services do (`gateway: platform/gw`, `gateways/served.py`).

The owner's state is read, never written, from where this project's `.dstack/projects.yml`
says it lives; read once per command. A fleet resolves when the owner's state has it; a run
is *placed* on it only while one of the owner's exports shares it with this project (a
revoked export refuses new placements, and leaves what runs alone: this project can still
list, stop and delete its jobs there). This project's users reach the hosts with their own
SSH identity: the owner's key files are dropped from the fleet's `ssh_config` (the owner's
state holds paths and fingerprints, never a key), and `.dstack/projects.yml`'s `ssh` gives
another login user or key file. Host keys stay the ones the owner pinned. Only the owner's
apply puts agents on hosts: an importer talks to the agents that run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dstack_plan.errors import DstackPlanError, PlanError
from dstack_plan.sharing.projects_file import PROJECTS_FILE, ProjectsFile, load_projects
from dstack_plan.state.exports import exported_to
from dstack_plan.state.model import ResourceState, State
from dstack_plan.state.select import backend_at, parse_where

SEPARATOR = "/"
"""Between an owner project's name and its fleet's: `platform/gpu`."""


def is_imported(fleet: str) -> bool:
    """Whether `fleet` names another project's fleet (`owner/name`)."""
    return SEPARATOR in fleet


class NotImported(PlanError):
    """Another project's fleet that this project cannot use: an unknown project, a state
    that cannot be read, a fleet it lacks or does not share with this project."""


class Imports:
    """Other projects' states and fleets, for one command of the project `project`."""

    def __init__(self, project_dir: str | Path, project: str) -> None:
        self.project_dir = Path(project_dir)
        self.project = project
        self._projects: ProjectsFile | None = None
        self._states: dict[str, State] = {}
        """Other projects' states by location, read once per command (per watch tick)."""

    def forget(self) -> None:
        """Read `.dstack/projects.yml` and the other projects' states again when next
        needed: a long-lived process (watch) sees exports revoked and policies published
        since."""
        self._projects = None
        self._states.clear()

    def state_at(self, location: str) -> State:
        """The state at `location` (a path, relative to this project, or an `s3://` URL),
        read once until `forget`; DstackPlanError when it cannot be read. The one read of
        another project's state: an owner's (this project imports) or an importer's (this
        project is the owner)."""
        cached = self._states.get(location)
        if cached is None:
            cached = backend_at(parse_where(location, self.project_dir)).read().state
            self._states[location] = cached
        return cached

    @property
    def projects(self) -> ProjectsFile:
        """`.dstack/projects.yml`, read when first needed."""
        if self._projects is None:
            self._projects = load_projects(self.project_dir)
        return self._projects

    def state_of(self, owner: str) -> State:
        """The state of project `owner`, read once; NotImported naming the project and the
        location when it is not listed or cannot be read."""
        other = self.projects.projects.get(owner)
        if other is None:
            known = ", ".join(sorted(self.projects.projects)) or "none"
            raise NotImported(
                f"project {owner!r} is not in {PROJECTS_FILE} (projects: {known}): add it with "
                "the location of its state (`state: s3://...` or a path)"
            )
        try:
            return self.state_at(other.state)
        except DstackPlanError as e:
            raise NotImported(
                f"project {owner!r}: cannot read its state at {other.state}: {e}"
            ) from None

    def fleet(self, qualified: str, *, placing: bool) -> ResourceState:
        """The state entry of fleet `owner/name` as this project reaches it (its own SSH
        identity); with `placing`, only while an export shares it with this project."""
        owner, _, name = qualified.partition(SEPARATOR)
        state = self.state_of(owner)
        entry = state.get(f"fleet.{name}")
        if entry is None:
            fleets = sorted(r.name for r in state.resources.values() if r.kind == "fleet")
            raise NotImported(
                f"fleet {name!r} of project {owner!r}: its state has no such fleet (its "
                f"fleets: {', '.join(fleets) or 'none'})"
            )
        if placing and exported_to(state.exports, "fleet", name, self.project) is None:
            raise NotImported(
                f"fleet {name!r} of project {owner!r} is not exported to project "
                f"{self.project!r}: the owner shares it with `dstack export create NAME "
                f"--fleet {name} --importer {self.project}`"
            )
        return self._as_importer(owner, entry)

    def gateway(self, owner: str, name: str) -> ResourceState:
        """The state entry of gateway `name` of project `owner`, while an export shares it with
        this project (its services are then served there); NotImported naming what is not."""
        state = self.state_of(owner)
        entry = state.get(f"gateway.{name}")
        if entry is None or entry.tainted:
            gateways = sorted(r.name for r in state.resources.values() if r.kind == "gateway")
            raise NotImported(
                f"gateway {name!r} of project {owner!r}: its state has no such gateway (its "
                f"gateways: {', '.join(gateways) or 'none'})"
            )
        if exported_to(state.exports, "gateway", name, self.project) is None:
            raise NotImported(
                f"gateway {name!r} of project {owner!r} is not exported to project "
                f"{self.project!r}: the owner shares it with `dstack export create NAME "
                f"--gateway {name} --importer {self.project}`"
            )
        return entry

    def shared_with_me(self) -> tuple[dict[str, ResourceState], list[str]]:
        """Every fleet the projects of `.dstack/projects.yml` export to this one, by
        `owner/name` (as `fleet`, placing allowed), and why an owner could not be read."""
        found: dict[str, ResourceState] = {}
        problems: list[str] = []
        for owner in sorted(self.projects.projects):
            try:
                state = self.state_of(owner)
            except NotImported as e:
                problems.append(str(e))
                continue
            for export in state.exports.values():
                if export.importer(self.project) is None:
                    continue
                for name in export.fleets:
                    entry = state.get(f"fleet.{name}")
                    if entry is not None:
                        found[f"{owner}{SEPARATOR}{name}"] = self._as_importer(owner, entry)
        return dict(sorted(found.items())), problems

    def _as_importer(self, owner: str, entry: ResourceState) -> ResourceState:
        ssh = entry.spec.get("ssh_config")
        if not isinstance(ssh, dict):
            return entry
        other = self.projects.projects[owner]
        spec = {**entry.spec, "ssh_config": importer_ssh_config(ssh, other.ssh)}
        return entry.model_copy(update={"spec": spec})


def imported_fleet_names(imports: Imports | None) -> list[str]:
    """`owner/name` of every fleet other projects export to this one (none without
    `imports`, or when `.dstack/projects.yml` names no project): what `top` and `offer` show
    after this project's own fleets."""
    if imports is None or not imports.projects.projects:
        return []
    return list(imports.shared_with_me()[0])


def importer_ssh_config(ssh: dict[str, Any], identity: Any) -> dict[str, Any]:
    """The owner's normalised `ssh_config` without its key files and keys (this project's
    users log in with their own: the ssh-agent and default keys), with `identity`'s user
    and key file (`SSHIdentity`, or None) where it gives them."""
    user = getattr(identity, "user", None)
    key = getattr(identity, "identity_file", None)
    dropped = ("identity_file", "ssh_key")
    hosts = []
    for host in ssh.get("hosts") or ():
        if isinstance(host, dict):
            host = {k: v for k, v in host.items() if k not in dropped}
            if user is not None:
                host.pop("user", None)
        hosts.append(host)
    config = {k: v for k, v in ssh.items() if k not in dropped}
    config["hosts"] = hosts
    if user is not None:
        config["user"] = user
    if key is not None:
        config["identity_file"] = key
    return config
