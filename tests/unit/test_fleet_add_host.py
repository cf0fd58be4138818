"""`dstack fleet add-host`: the host is added in the fleet's own file and document, and
nothing else in the file changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dstack_plan.config.add_host import add_host
from dstack_plan.config.loader import load_project
from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.limits import checked_dependencies
from tests.conftest import run_main

FLEET = """\
# On-prem boxes.   Keep this comment: it says why.
type: fleet
name: gpu   # the team's pool

ssh_config:
  # everyone logs in as ubuntu
  user: ubuntu
  identity_file: ~/.ssh/id_ed25519

  hosts:
    - 10.0.0.1    # rack 1
    # rack 2 is being repaired
    - hostname: 10.0.0.2
      port: 2222

    # a commented-out host stays where it was
    # - 10.0.0.3

  network: 10.0.0.0/24
placement: cluster
"""


def inserted(before: str, after: str) -> list[str]:
    """The lines `after` has on top of `before`, asserting that everything else in `after`
    is `before` byte for byte, in order."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    start = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), len(old))
    added = len(new) - len(old)
    assert added > 0
    assert new[:start] + new[start + added :] == old
    return new[start : start + added]


def write(tmp_path: Path, text: str, name: str = "gpu.dstack.yml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def hosts(tmp_path: Path, address: str = "fleet.gpu") -> list[tuple[str, int | None, str | None]]:
    spec = load_project(tmp_path).resources[address].spec
    return [(h.hostname, h.port, h.user) for h in spec.ssh_config.hosts]  # type: ignore[union-attr]


def test_a_host_is_added_after_the_last_one_and_nothing_else_changes(tmp_path: Path) -> None:
    path = write(tmp_path, FLEET)
    added = add_host(tmp_path, [], "gpu", "ssh://ubuntu@10.0.0.4")
    text = path.read_text()
    # the user is ssh_config's and the port the default: a bare hostname, as dstack writes one
    assert inserted(FLEET, text) == ["    - 10.0.0.4\n"]
    assert text.index("- 10.0.0.4") < text.index("# a commented-out host")
    assert hosts(tmp_path)[-1] == ("10.0.0.4", None, None)
    assert (added.file, added.entry) == ("gpu.dstack.yml", {"hostname": "10.0.0.4"})


def test_a_different_user_port_or_key_is_written_on_the_host(tmp_path: Path) -> None:
    path = write(tmp_path, FLEET)
    add_host(tmp_path, [], "gpu", "ssh://admin@10.0.0.2:2200", identity_file="~/.ssh/admin")
    assert inserted(FLEET, path.read_text()) == [
        "    - hostname: 10.0.0.2\n",
        "      port: 2200\n",
        "      user: admin\n",
        "      identity_file: ~/.ssh/admin\n",
    ]
    assert hosts(tmp_path)[-1] == ("10.0.0.2", 2200, "admin")


def test_what_ssh_config_already_says_is_not_repeated(tmp_path: Path) -> None:
    text = FLEET.replace("  user: ubuntu\n", "  user: ubuntu\n  port: 2022\n")
    path = write(tmp_path, text)
    add_host(tmp_path, [], "gpu", "ssh://ubuntu@10.0.0.5:2022", identity_file="~/.ssh/id_ed25519")
    assert inserted(text, path.read_text()) == ["    - 10.0.0.5\n"]


def test_the_next_plan_shows_the_new_host_as_an_in_place_update(tmp_path: Path) -> None:
    write(tmp_path, FLEET)
    added = add_host(tmp_path, [], "gpu", "ssh://ubuntu@10.0.0.1:2223")
    checked_dependencies(load_project(tmp_path), tmp_path)  # the file validates as plan checks
    diff = diff_specs("fleet", added.before.normalized, added.after.normalized)
    assert (diff.changed, diff.forces_replacement) == (("ssh_config.hosts",), ())
    new_hosts = diff.after["ssh_config"]["hosts"]
    assert new_hosts[-1] == {"hostname": "10.0.0.1", "port": 2223, "blocks": 1}
    assert new_hosts[:-1] == added.before.normalized["ssh_config"]["hosts"]


TASK = "# a task first\ntype: task\nname: train\ncommands: [python train.py]\n"
OTHER_FLEET = "type: fleet\nname: cpu\nssh_config:\n  user: u\n  hosts: [10.1.0.1]\n"


def test_the_fleet_is_found_in_its_document_of_a_multi_document_file(tmp_path: Path) -> None:
    text = f"{TASK}---\n{FLEET}---\n{OTHER_FLEET}"
    path = write(tmp_path, text, "all.dstack.yml")
    add_host(tmp_path, [], "gpu", "ssh://ubuntu@10.0.0.7")
    assert inserted(text, path.read_text()) == ["    - 10.0.0.7\n"]
    add_host(tmp_path, [], "cpu", "ssh://u@10.1.0.2:2201")
    last = path.read_text().splitlines()[-1]
    assert last == "  hosts: [10.1.0.1, {hostname: 10.1.0.2, port: 2201}]"
    assert hosts(tmp_path, "fleet.cpu") == [("10.1.0.1", None, None), ("10.1.0.2", 2201, None)]
    assert hosts(tmp_path)[-1] == ("10.0.0.7", None, None)


def test_a_flow_list_and_a_last_line_without_newline_are_kept(tmp_path: Path) -> None:
    text = OTHER_FLEET.replace("[10.1.0.1]", "[10.1.0.1]  # two racks").rstrip("\n")
    path = write(tmp_path, text)
    add_host(tmp_path, [], "cpu", "ssh://u@10.1.0.9")
    assert path.read_text() == text.replace("[10.1.0.1]", "[10.1.0.1, 10.1.0.9]")
    block = "type: fleet\nname: cpu\nssh_config:\n  user: u\n  hosts:\n  - a.example\n  - b"
    write(tmp_path, block)
    add_host(tmp_path, [], "cpu", "ssh://u@c.example")
    assert (tmp_path / "gpu.dstack.yml").read_text() == block + "\n  - c.example\n"


def test_an_empty_list_and_a_flow_list_over_lines_get_the_host(tmp_path: Path) -> None:
    path = write(tmp_path, OTHER_FLEET.replace("[10.1.0.1]", "[]"))
    add_host(tmp_path, [], "cpu", "ssh://u@10.1.0.9")
    assert path.read_text() == OTHER_FLEET.replace("[10.1.0.1]", "[10.1.0.9]")
    # no line to insert on: ruamel's round-trip dump writes the document, comments kept
    write(tmp_path, "# pool\n" + OTHER_FLEET.replace("[10.1.0.1]", "[10.1.0.1,\n    10.1.0.2]"))
    add_host(tmp_path, [], "cpu", "ssh://u@10.1.0.9")
    assert path.read_text().startswith("# pool\ntype: fleet\n")
    assert [h[0] for h in hosts(tmp_path, "fleet.cpu")] == ["10.1.0.1", "10.1.0.2", "10.1.0.9"]


def test_crlf_line_ends_are_kept(tmp_path: Path) -> None:
    text = FLEET.replace("\n", "\r\n")
    path = write(tmp_path, text)
    add_host(tmp_path, [], "gpu", "ssh://ubuntu@10.0.0.4")
    assert path.read_bytes().decode().count("\r\n") == text.count("\r\n")


def test_file_picks_the_file_and_keeps_its_mode(tmp_path: Path) -> None:
    write(tmp_path, TASK, "a.dstack.yml")
    path = write(tmp_path, FLEET, "fleets.yml")  # not a name the project would find
    os.chmod(path, 0o640)
    added = add_host(tmp_path, [str(path)], "gpu", "ssh://ubuntu@10.0.0.4")
    assert inserted(FLEET, path.read_text()) == ["    - 10.0.0.4\n"]
    assert (path.stat().st_mode & 0o777, added.after.address) == (0o640, "fleet.gpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.dstack.yml", "fleets.yml"]


def test_the_cli_adds_the_host_and_says_what_the_plan_will_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, FLEET)
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "fleet",
        "add-host",
        "gpu",
        "ssh://bob@10.0.0.4",
        "--dir",
        str(tmp_path),
    )
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "Added {hostname: 10.0.0.4, user: bob} to fleet.gpu in gpu.dstack.yml.",
        "The next plan shows fleet.gpu updated in-place (changed: ssh_config.hosts).",
    ]


@pytest.mark.parametrize(
    ("fleet", "url", "error"),
    [
        (
            "gpu",
            "ssh://ubuntu@10.0.0.1",
            "gpu.dstack.yml:11:7: error: host 10.0.0.1 port 22 is already listed in fleet.gpu",
        ),
        (  # the port is what tells it apart: 2222 is the second host
            "gpu",
            "ssh://other@10.0.0.2:2222",
            "gpu.dstack.yml:13:7: error: host 10.0.0.2 port 2222 is already listed in fleet.gpu",
        ),
        (
            "pool",
            "ssh://u@10.0.0.9",
            "Error: fleet.pool (pool.dstack.yml) is not an SSH fleet: add-host adds hosts to "
            "fleets with ssh_config",
        ),
        ("nope", "ssh://u@h", "Error: fleet.nope is not declared in the project in {dir} "),
        ("gpu", "10.0.0.9", "Error: invalid host URL '10.0.0.9': expected ssh://USER@HOST[:PORT]"),
        ("gpu", "ssh://u@h;reboot", "(bad host name 'h;reboot')"),
        ("gpu", "ssh://u@h:0", "(the port must be from 1 to 65535, got 0)"),
        ("gpu", "ssh://u@h/path", "Error: invalid host URL 'ssh://u@h/path'"),
        ("gpu", "ssh://u@[fd00::zz]", "(bad IPv6 address 'fd00::zz')"),
    ],
)
def test_refusals_are_clear_errors_and_leave_the_files_alone(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fleet: str,
    url: str,
    error: str,
) -> None:
    path = write(tmp_path, FLEET)
    write(tmp_path, "type: fleet\nname: pool\nnodes: 2\n", "pool.dstack.yml")
    code, out, err = run_main(
        monkeypatch, capsys, "fleet", "add-host", fleet, url, "--dir", str(tmp_path)
    )
    assert code == 1
    assert error.format(dir=tmp_path) in err
    assert "Traceback" not in out + err
    assert path.read_text() == FLEET


def test_a_host_without_any_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = FLEET.replace("  user: ubuntu\n", "")
    path = write(tmp_path, text)
    code, _, err = run_main(
        monkeypatch, capsys, "fleet", "add-host", "gpu", "ssh://10.0.0.9", "--dir", str(tmp_path)
    )
    assert code == 1
    assert "no user for 10.0.0.9: give ssh://USER@10.0.0.9 or set ssh_config.user" in err
    assert path.read_text() == text
