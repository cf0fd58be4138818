"""The project's SSH key for its cloud machines: made once, private, reused."""

from __future__ import annotations

import stat
from pathlib import Path

import asyncssh

from dstack_plan.providers.project_key import KEY_FILE, project_key


def test_the_key_is_generated_once_private_and_its_public_half_matches(tmp_path: Path) -> None:
    first = project_key(tmp_path)
    assert first.private_path == (tmp_path / KEY_FILE).resolve()
    assert stat.S_IMODE(first.private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.private_path.parent.stat().st_mode) == 0o700
    assert first.public_openssh.startswith("ssh-ed25519 ")
    private = asyncssh.read_private_key(str(first.private_path))
    assert private.export_public_key("openssh").decode().strip() == first.public_openssh
    assert project_key(tmp_path) == first  # reused, not regenerated
    first.private_path.with_suffix(".pub").unlink()
    assert project_key(tmp_path).public_openssh == first.public_openssh  # derived again
    assert sorted(p.name for p in first.private_path.parent.iterdir()) == [
        "id_ed25519",
        "id_ed25519.pub",
    ]
