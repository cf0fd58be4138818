"""The SSH key a project's cloud machines are reached with: `.dstack/ssh/id_ed25519`.

Generated on first use (ed25519, the private half readable by its owner only) and kept in the
project's `.dstack/`, which `dstack init` keeps out of git. Its public half is what providers
inject into the machines they create (an EC2 key pair, GCP metadata, an Azure VM's
`ssh_public_keys`); the private half never leaves this machine, and state records only its
path. A project moved to another machine brings the file along, or its cloud hosts are
reachable only after they are recreated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = ".dstack/ssh/id_ed25519"


@dataclass(frozen=True, slots=True)
class ProjectKey:
    private_path: Path
    public_openssh: str
    """`ssh-ed25519 AAAA... dstack-plan`, one line."""


def project_key(project_dir: str | Path) -> ProjectKey:
    """The project's key, generated when it has none yet."""
    import asyncssh

    path = (Path(project_dir) / KEY_FILE).resolve()
    if not path.exists():
        _generate(path)
    public = path.with_suffix(".pub")
    if not public.exists():
        key = asyncssh.read_private_key(str(path))
        public.write_bytes(key.export_public_key("openssh"))
    return ProjectKey(path, public.read_text().strip())


def _generate(path: Path) -> None:
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519", comment="dstack-plan")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.export_private_key("openssh"))
    try:
        os.link(tmp, path)  # two first uses at once: the first key stays, the other is dropped
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
