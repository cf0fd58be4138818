"""What `plan` checks about SSH fleets without touching a host (`plan/host_checks.py`): a host
belongs to one fleet (`validate` too), and every identity file a fleet names can be read here
(`plan` only: `validate` checks the configuration, not this machine)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncssh
import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.config.resource import STATE_SOURCE, Desired, Resource, Source
from dstack_plan.errors import ConfigError, SSHError
from dstack_plan.plan.host_checks import identity_file_problem, local_fact_issues
from dstack_plan.plan.limits import checked_dependencies
from dstack_plan.project import Project
from dstack_plan.providers.ssh.connect import _client_keys
from dstack_plan.providers.ssh.models import SSHTarget
from tests.conftest import run_main

FLEET_A = """\
type: fleet
name: fleet-a
ssh_config:
  user: ubuntu
  hosts:
    - 10.0.0.4
    - 10.0.0.5
"""
FLEET_B = """\
type: fleet
name: fleet-b
ssh_config:
  user: ubuntu
  hosts:
    - 10.0.0.9
    - {hostname: 10.0.0.5, port: 22}
"""
SHARED = (
    "b.dstack.yml:7:7: error: host 10.0.0.5 port 22 is already in fleet.fleet-a "
    "(a.dstack.yml:7:7); a host belongs to one fleet"
)


def write(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.dstack.yml").write_text(text)
    return directory


def errors(directory: Path, *, local_facts: bool = False) -> list[str]:
    try:
        checked_dependencies(load_project(directory), directory, local_facts=local_facts)
    except ConfigError as e:
        return [str(i) for i in e.issues]
    return []


def plan_errors(directory: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        asyncio.run(Project(directory, state_path=directory / "state.json").plan())
    return [str(i) for i in info.value.issues]


# -- a host belongs to one fleet ----------------------------------------------------------


def test_a_host_in_two_fleets_is_an_error_at_the_second_fleets_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write(tmp_path / "p", a=FLEET_A, b=FLEET_B)
    assert errors(directory) == [SHARED]
    assert plan_errors(directory) == [SHARED]
    code, out, err = run_main(monkeypatch, capsys, "validate", str(directory))
    assert (code, err.splitlines()) == (1, [SHARED])
    assert "Traceback" not in out + err


def test_the_second_is_in_declaration_order_within_one_file(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", f=f"{FLEET_B}---\n{FLEET_A}")
    assert errors(directory) == [
        "f.dstack.yml:15:7: error: host 10.0.0.5 port 22 is already in fleet.fleet-b "
        "(f.dstack.yml:7:7); a host belongs to one fleet"
    ]


def test_the_same_address_on_another_port_is_another_host(tmp_path: Path) -> None:
    other_port = FLEET_B.replace("port: 22}", "port: 2222}")
    assert errors(write(tmp_path / "p", a=FLEET_A, b=other_port)) == []
    # the fleet's port is the host's when the host gives none
    fleet_port = FLEET_B.replace("  user: ubuntu\n", "  user: ubuntu\n  port: 2200\n")
    fleet_port = fleet_port.replace("{hostname: 10.0.0.5, port: 22}", "10.0.0.5")
    assert errors(write(tmp_path / "q", a=FLEET_A, b=fleet_port)) == []


def test_every_later_fleet_is_told_of_the_first_and_a_repeat_within_a_fleet_once(
    tmp_path: Path,
) -> None:
    third = FLEET_B.replace("fleet-b", "fleet-c").replace("10.0.0.9", "10.0.0.5")
    directory = write(tmp_path / "p", a=FLEET_A, b=FLEET_B, c=third)
    first = "fleet.fleet-a (a.dstack.yml:7:7); a host belongs to one fleet"
    assert errors(directory) == [
        f"b.dstack.yml:7:7: error: host 10.0.0.5 port 22 is already in {first}",
        f"c.dstack.yml:6:7: error: host 10.0.0.5 port 22 is already in {first}",
        # its second entry is limits' own error (listed twice), not a second "already in"
        "c.dstack.yml:7:7: error: host 10.0.0.5 port 22 is listed twice "
        "(first as ssh_config.hosts[0])",
    ]


def test_a_submissions_fleet_on_a_host_of_a_fleet_in_state_is_refused(tmp_path: Path) -> None:
    directory = write(tmp_path / "p", b=FLEET_B)
    given = load_project(directory)
    [in_state] = load_project(write(tmp_path / "s", a=FLEET_A))
    context = Resource("fleet", "fleet-a", in_state.spec, Source(STATE_SOURCE, 0))
    desired = Desired({**given.resources, context.address: context}, submission=True)
    with pytest.raises(ConfigError) as info:
        checked_dependencies(desired, directory)
    assert [str(i) for i in info.value.issues] == [
        "b.dstack.yml:7:7: error: host 10.0.0.5 port 22 is already in fleet.fleet-a "
        "(in state); a host belongs to one fleet"
    ]


# -- identity files -------------------------------------------------------------------------

KEYED = """\
type: fleet
name: keyed
ssh_config:
  user: ubuntu
  identity_file: {fleet}
  hosts:
    - 10.0.0.1
    - hostname: 10.0.0.2
      identity_file: {host}
      proxy_jump: {{hostname: bastion, user: jump, identity_file: {jump}}}
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory with `~/.ssh/id_test` (a key file: its content is not checked)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_test").write_text("a key\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def keyed(tmp_path: Path, fleet: str, host: str = "~/.ssh/id_test", jump: str = "") -> Path:
    text = KEYED.format(fleet=fleet, host=host, jump=jump or "~/.ssh/id_test")
    return write(tmp_path / "p", keyed=text)


def test_a_missing_identity_file_is_refused_by_plan_at_its_value(
    tmp_path: Path, home: Path
) -> None:
    directory = keyed(tmp_path, "~/.ssh/missing")
    expected = "keyed.dstack.yml:5:18: error: identity_file ~/.ssh/missing: no such file"
    assert errors(directory, local_facts=True) == [expected]
    assert plan_errors(directory) == [expected]


def test_validate_does_not_look_for_identity_files(
    tmp_path: Path,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a configuration is valid on a machine without the fleet's keys (CI, dstack's examples)
    directory = keyed(tmp_path, "~/.ssh/missing", host="/nope/id", jump="~/.ssh/gone")
    assert errors(directory) == []
    code, out, err = run_main(monkeypatch, capsys, "validate", str(directory))
    assert (code, out.strip(), err) == (0, "1 resource OK", "")


def test_the_hosts_and_proxy_jumps_identity_files_are_checked_too(
    tmp_path: Path, home: Path
) -> None:
    directory = keyed(tmp_path, "~/.ssh/id_test", host=str(home / ".ssh"), jump="~/.ssh/nojump")
    assert errors(directory, local_facts=True) == [
        f"keyed.dstack.yml:9:22: error: identity_file {home / '.ssh'} is a directory",
        "keyed.dstack.yml:10:66: error: identity_file ~/.ssh/nojump: no such file",
    ]


def test_the_fleets_proxy_jump_identity_file_is_checked(tmp_path: Path, home: Path) -> None:
    text = (
        "type: fleet\nname: jumped\nssh_config:\n  user: u\n"
        "  proxy_jump:\n    hostname: bastion\n    user: j\n    identity_file: ~/.ssh/nope\n"
        "  hosts: [10.0.0.1]\n"
    )
    assert errors(write(tmp_path / "p", jumped=text), local_facts=True) == [
        "jumped.dstack.yml:8:20: error: identity_file ~/.ssh/nope: no such file"
    ]


def test_tilde_is_the_users_home(tmp_path: Path, home: Path) -> None:
    assert errors(keyed(tmp_path, "~/.ssh/id_test"), local_facts=True) == []
    assert identity_file_problem("~/.ssh/id_test") is None
    assert identity_file_problem("~/.ssh/other") == ": no such file"
    (home / ".ssh" / "id_test").unlink()
    assert identity_file_problem(str(home / ".ssh" / "id_test")) == ": no such file"


def test_a_relative_path_is_from_where_the_command_runs_as_for_the_provider(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "cwd" / "keys"
    keys.mkdir(parents=True)
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(keys / "id"))
    directory = keyed(tmp_path, "keys/id")  # not the project directory's keys/id
    monkeypatch.chdir(tmp_path / "cwd")
    assert errors(directory, local_facts=True) == []
    found = _client_keys(SSHTarget("10.0.0.1", "u", identity_file="keys/id"))
    assert len(found["client_keys"]) == 1  # the provider reads the very same file

    monkeypatch.chdir(directory)
    assert errors(directory, local_facts=True) == [
        "keyed.dstack.yml:5:18: error: identity_file keys/id: no such file "
        f"(looked for {directory / 'keys' / 'id'})"
    ]
    with pytest.raises(SSHError, match="identity_file keys/id does not exist"):
        _client_keys(SSHTarget("10.0.0.1", "u", identity_file="keys/id"))


def test_a_directory_is_not_an_identity_file(tmp_path: Path, home: Path) -> None:
    assert identity_file_problem(str(home)) == " is a directory"
    assert identity_file_problem("~/.ssh") == " is a directory"


def test_a_file_under_a_file_is_no_such_file(home: Path) -> None:
    assert identity_file_problem("~/.ssh/id_test/key") == ": no such file"


def _unreadable(tmp_path: Path) -> str:
    """A regular file the current user cannot read: mode 000, or for root (who reads any
    file's content regardless of its mode) a write-only kernel setting."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked_key"
        locked.write_text("a key\n")
        locked.chmod(0)
        return str(locked)
    for candidate in ("/proc/sys/vm/compact_memory", "/proc/sys/vm/drop_caches"):
        try:
            with open(candidate, "rb"):
                continue  # readable after all (an unusual kernel): try the next
        except PermissionError:
            return candidate
        except OSError:
            continue
    pytest.skip("running as root, and no file here that root cannot read")


def test_an_unreadable_identity_file_is_refused(tmp_path: Path, home: Path) -> None:
    locked = _unreadable(tmp_path)
    assert identity_file_problem(locked) == " is not readable (permission denied)"
    assert errors(keyed(tmp_path, locked), local_facts=True) == [
        f"keyed.dstack.yml:5:18: error: identity_file {locked} is not readable (permission denied)"
    ]


def test_an_inline_private_key_needs_no_file(tmp_path: Path, home: Path) -> None:
    inline = "  ssh_key: {public: ssh-ed25519 AAAA, private: KEY}\n"
    text = KEYED.format(fleet="~/.ssh/none", host="~/.ssh/none", jump="~/.ssh/id_test")
    text = text.replace("  hosts:\n", inline + "  hosts:\n")
    # the provider uses the inline key, for the fleet and for the host that has none of its own
    assert errors(write(tmp_path / "p", keyed=text), local_facts=True) == []
    jump_inline = KEYED.format(fleet="~/.ssh/id_test", host="~/.ssh/id_test", jump="~/.ssh/none")
    inline_jump = "identity_file: ~/.ssh/none, ssh_key: {public: p, private: k}}"
    jump_inline = jump_inline.replace("identity_file: ~/.ssh/none}", inline_jump)
    assert errors(write(tmp_path / "q", keyed=jump_inline), local_facts=True) == []


def test_a_public_key_alone_is_no_inline_private_key(tmp_path: Path, home: Path) -> None:
    text = KEYED.format(fleet="~/.ssh/none", host="~/.ssh/id_test", jump="~/.ssh/id_test")
    text = text.replace("  hosts:\n", "  ssh_key: {public: ssh-ed25519 AAAA}\n  hosts:\n")
    assert errors(write(tmp_path / "p", keyed=text), local_facts=True) == [
        "keyed.dstack.yml:5:18: error: identity_file ~/.ssh/none: no such file"
    ]


def test_one_look_per_file_and_one_error_per_place(tmp_path: Path, home: Path) -> None:
    directory = keyed(tmp_path, "~/.ssh/gone", host="~/.ssh/gone", jump="~/.ssh/gone")
    desired = load_project(directory)
    assert [(i.line, i.column) for i in local_fact_issues(desired, directory)] == [
        (5, 18),
        (9, 22),
        (10, 66),
    ]


def test_a_submissions_context_fleet_is_not_checked(tmp_path: Path, home: Path) -> None:
    [fleet] = load_project(keyed(tmp_path, "~/.ssh/gone"))
    context = Resource("fleet", "keyed", fleet.spec, Source(STATE_SOURCE, 0))
    assert local_fact_issues(Desired({context.address: context}, submission=True)) == []
