"""Finding configuration files: special files with a config's name are skipped, not read."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dstack_plan.config.discover import discover


def test_a_fifo_or_socket_named_like_a_config_is_skipped_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "real.dstack.yml").write_text("type: task\ncommands: [echo]\n")
    os.mkfifo(tmp_path / "fifo.dstack.yml")  # opening it to read would wait for a writer
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock.dstack.yml"))
        warnings: list[str] = []
        found = discover(tmp_path, warn=warnings.append)
    assert found == [tmp_path / "real.dstack.yml"]
    assert sorted(warnings) == [
        f"skipped {tmp_path / 'fifo.dstack.yml'}: not a regular file",
        f"skipped {tmp_path / 'sock.dstack.yml'}: not a regular file",
    ]


def test_a_dangling_link_is_left_to_the_reader_which_names_it(tmp_path: Path) -> None:
    (tmp_path / "gone.dstack.yml").symlink_to(tmp_path / "nowhere")
    warnings: list[str] = []
    assert discover(tmp_path, warn=warnings.append) == [tmp_path / "gone.dstack.yml"]
    assert warnings == []
