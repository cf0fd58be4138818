"""The SSH config `dstack attach` writes for dev environments (`runs/ssh_config.py`) and
what it prints (`inspect/dev_ssh.py`): blocks, the one Include, removal, odd values refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.errors import DstackPlanError
from dstack_plan.inspect.dev_ssh import DevAccess
from dstack_plan.runs.ssh_config import (
    CONFIG_DIR_ENV,
    INCLUDE_NOTE,
    Entry,
    HostBlock,
    config_dir,
    ensure_include,
    known_host,
    parse_sections,
    remove_entries,
    render_entry,
    user_config,
    write_entry,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOq0"


def entry(run: str = "dev", job: str = "dev-0-0-1-d1", deployment: str = "d1") -> Entry:
    jump = HostBlock(
        alias=f"dstack-plan-jump-{run}",
        hostname="10.0.0.5",
        port=2222,
        user="ubuntu",
        identity_file=Path("/keys/fleet key"),
    )
    job_block = HostBlock(
        alias=run,
        hostname="127.0.0.1",
        port=40001,
        user="root",
        identity_file=Path("/p/.dstack/ssh/id_ed25519"),
        proxy_jump=jump.alias,
        host_key_alias=f"dstack-plan-{run}",
        keepalive=True,
    )
    known = (known_host(f"dstack-plan-{run}", 22, KEY), known_host("10.0.0.5", 2222, KEY))
    return Entry(run, job, deployment, (jump, job_block), known)


def test_an_entry_renders_the_jump_host_then_the_job_with_pinned_keys(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts" / "dev"
    assert render_entry(entry(), tmp_path) == (
        "# dstack-plan: begin dev job=dev-0-0-1-d1 deployment=d1\n"
        "Host dstack-plan-jump-dev\n"
        "    HostName 10.0.0.5\n"
        "    Port 2222\n"
        "    User ubuntu\n"
        '    IdentityFile "/keys/fleet key"\n'
        "    IdentitiesOnly yes\n"
        f'    UserKnownHostsFile "{known}"\n'
        "    StrictHostKeyChecking yes\n"
        "    CheckHostIP no\n"
        "\n"
        "Host dev\n"
        "    HostName 127.0.0.1\n"
        "    Port 40001\n"
        "    User root\n"
        '    IdentityFile "/p/.dstack/ssh/id_ed25519"\n'
        "    IdentitiesOnly yes\n"
        "    ProxyJump dstack-plan-jump-dev\n"
        "    HostKeyAlias dstack-plan-dev\n"
        f'    UserKnownHostsFile "{known}"\n'
        "    StrictHostKeyChecking yes\n"
        "    CheckHostIP no\n"
        "    ServerAliveInterval 30\n"
        "    ServerAliveCountMax 4\n"
        "# dstack-plan: end dev\n"
    )
    assert known_host("10.0.0.5", 22, KEY) == f"10.0.0.5 {KEY}"
    assert known_host("10.0.0.5", 2222, KEY) == f"[10.0.0.5]:2222 {KEY}"


def test_a_host_known_only_to_the_users_known_hosts_is_checked_there(tmp_path: Path) -> None:
    block = HostBlock("j", "jump.example.com", 22, "me", pinned=False)
    text = render_entry(Entry("dev", "dev-0", "d1", (block,)), tmp_path)
    assert f'UserKnownHostsFile "{tmp_path}/known_hosts/dev" ~/.ssh/known_hosts' in text
    assert "IdentityFile" not in text  # no key given: ssh's own defaults, as the fleet's


@pytest.mark.parametrize(
    "block",
    [
        HostBlock("dev", "h\n    ProxyCommand touch /tmp/pwned", 22, "root"),
        HostBlock("dev", "h", 22, "root -oProxyCommand=x"),
        HostBlock("dev x", "h", 22, "root"),
        HostBlock("dev", "h", 22, "root", identity_file=Path('/a"b')),
        HostBlock("dev", "h", 22, "root", proxy_jump="a,evil"),
    ],
)
def test_a_value_that_would_change_the_config_is_refused(block: HostBlock, tmp_path: Path) -> None:
    with pytest.raises(DstackPlanError, match="cannot write"):
        render_entry(Entry("dev", "dev-0", "d1", (block,)), tmp_path)
    with pytest.raises(DstackPlanError):
        known_host("h", 22, "ssh-ed25519 AAAA\nHost *")


def test_percent_in_a_path_is_escaped_as_ssh_expands_tokens_there(tmp_path: Path) -> None:
    block = HostBlock("dev", "h", 22, "root", identity_file=Path("/keys/100%/id"))
    assert 'IdentityFile "/keys/100%%/id"' in render_entry(
        Entry("dev", "d", "x", (block,)), tmp_path
    )


def test_writing_replaces_the_runs_entry_and_keeps_everything_else(tmp_path: Path) -> None:
    directory = tmp_path / "ssh"
    config = directory / "config"
    directory.mkdir()
    config.write_text("# my own notes\nHost mine\n    HostName example.com\n")
    write_entry(entry("dev", "dev-0-0-1-d1"), directory)
    write_entry(entry("other", "other-0-0-1-d2", "d2"), directory)
    write_entry(entry("dev", "dev-0-0-2-d1"), directory)  # a newer job
    sections, other = parse_sections(config.read_text())
    assert [(s.run, s.job) for s in sections] == [
        ("other", "other-0-0-1-d2"),
        ("dev", "dev-0-0-2-d1"),
    ]
    assert other.strip("\n") == "# my own notes\nHost mine\n    HostName example.com"
    before = config.read_text()
    write_entry(entry("dev", "dev-0-0-2-d1"), directory)
    assert config.read_text() == before  # rewriting the same entry changes nothing
    assert (directory / "known_hosts" / "dev").read_text().splitlines() == list(
        entry().known_hosts
    )
    assert config.stat().st_mode & 0o777 == 0o600


def test_writing_drops_the_stale_entries_it_is_told_of(tmp_path: Path) -> None:
    write_entry(entry("old", "old-0-0-1-d1"), tmp_path)
    write_entry(entry("kept", "kept-0-0-1-d2", "d2"), tmp_path)
    write_entry(entry("dev"), tmp_path, stale=lambda s: s.deployment == "d1")
    sections, _ = parse_sections((tmp_path / "config").read_text())
    assert [s.run for s in sections] == ["kept", "dev"]
    assert not (tmp_path / "known_hosts" / "old").exists()


def test_removal_matches_the_runs_jobs_so_another_projects_entry_stays(tmp_path: Path) -> None:
    write_entry(entry("dev", "dev-0-0-1-theirs", "theirs"), tmp_path)
    assert remove_entries(tmp_path, run="dev", jobs={"dev-0-0-1-ours"}) == []
    assert "Host dev\n" in (tmp_path / "config").read_text()
    assert remove_entries(tmp_path, run="dev", jobs={"dev-0-0-1-theirs"}) == ["dev"]
    assert "Host dev" not in (tmp_path / "config").read_text()
    assert not (tmp_path / "known_hosts" / "dev").exists()
    assert remove_entries(tmp_path / "never-written", run="dev") == []


def test_the_include_goes_at_the_top_once(tmp_path: Path) -> None:
    user = tmp_path / "home" / ".ssh" / "config"
    ours = tmp_path / "dstack ssh" / "config"
    assert ensure_include(user, ours) is True  # created, 0600
    assert user.read_text() == f'{INCLUDE_NOTE}\nInclude "{ours}"\n'
    assert user.stat().st_mode & 0o777 == 0o600

    existing = tmp_path / "existing"
    existing.write_text("Host work\n    User me\n")
    existing.chmod(0o644)
    link = tmp_path / "linked-config"
    link.symlink_to(existing)  # dotfiles: the config is a symlink, and stays one
    write_entry(entry(), tmp_path / "d", include_into=link)
    write_entry(entry(), tmp_path / "d", include_into=link)
    text = existing.read_text()
    assert text == f"{INCLUDE_NOTE}\nInclude {tmp_path}/d/config\n\nHost work\n    User me\n"
    assert link.is_symlink() and existing.stat().st_mode & 0o777 == 0o644


def test_the_directory_variable_moves_the_config_and_leaves_ssh_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_dir() == tmp_path / ".dstack-plan" / "ssh"
    assert user_config() == tmp_path / ".ssh" / "config"
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "elsewhere"))
    assert config_dir() == tmp_path / "elsewhere"
    assert user_config() is None


def access(ide: str | None, included: bool = True, workdir: str = "/workflow") -> DevAccess:
    return DevAccess(
        "dev-environment.dev", "dev", "dev-0", workdir, ide, Path("/c/config"), included
    )


def test_attach_prints_ssh_and_the_ides_link() -> None:
    assert access("vscode").ssh_command == "ssh dev"
    assert access("vscode", included=False).ssh_command == "ssh -F /c/config dev"
    assert access("vscode").ide_link == "vscode://vscode-remote/ssh-remote+dev/workflow"
    assert access("cursor").ide_link == "cursor://vscode-remote/ssh-remote+dev/workflow"
    assert access("windsurf").ide_name == "Windsurf"
    assert access("zed").ide_link == "zed ssh://dev/workflow"
    assert access(None).ide_link is None
    assert access("vscode", workdir="/my work").ide_link == (
        "vscode://vscode-remote/ssh-remote+dev/my%20work"
    )
