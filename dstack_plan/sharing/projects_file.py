"""`.dstack/projects.yml`: the other projects this one names, and where their states live.

    projects:
      platform:
        state: s3://team-state/platform/state.json   # or a path (relative to the project)
        ssh: {user: alice, identity_file: ~/.ssh/id_ed25519}   # optional

An importer lists the owners whose exported fleets its runs use (`fleets: [platform/gpu]`);
an owner may list its importers, so that `dstack export create --importer ml` finds where
ml's state lives. The file is committed (it holds no secret: `ssh` names a key file, never a
key); each user reaches the owner's hosts with their own SSH identity: `ssh` when given, else
their ssh-agent and default keys.
"""

from __future__ import annotations

from pathlib import Path

from dstack_plan.config.base import Strict
from dstack_plan.config.project_name import ProjectName
from dstack_plan.config.settings_file import read_mapping, read_settings_text

PROJECTS_FILE = ".dstack/projects.yml"


class SSHIdentity(Strict):
    """How this project's users log in to another project's hosts, instead of the owner's
    `ssh_config.user` and with their own keys."""

    user: str | None = None
    identity_file: str | None = None


class OtherProject(Strict):
    """Another project: where its state lives, and how to reach its hosts."""

    state: str
    """A path (relative to this project's directory) or an `s3://` URL."""
    ssh: SSHIdentity | None = None


class ProjectsFile(Strict):
    """The file's content."""

    projects: dict[ProjectName, OtherProject] = {}


def load_projects(project_dir: str | Path) -> ProjectsFile:
    """The project's `.dstack/projects.yml`: empty when it has none; ConfigError locating
    every problem (FILE:LINE:COL) when it is invalid."""
    text = read_settings_text(project_dir, PROJECTS_FILE)
    document = (
        None if text is None else read_mapping(text, PROJECTS_FILE, "projects", required=False)
    )
    if document is None:
        return ProjectsFile()
    found = document.validate(ProjectsFile)
    document.raise_issues()
    return found
