"""One SSH session into a job: what the job's sshd runs for every login (its ForceCommand).

    python3 session.py SESSION.json

`job_sshd` copies this file beside the job's sshd config and names it in `ForceCommand`, so it
runs as its own script: it imports nothing but the standard library. The client's command
arrives in `$SSH_ORIGINAL_COMMAND` and is handed on as one argv word (`/bin/sh -c COMMAND`), never
pasted into a shell line; without one, the session is a login shell.

- a container job (`runtime: docker`): `docker exec -i [-t] CONTAINER ...`, so the session runs
  inside the job's container as its user, in its working dir, with its env;
- a process job (`runtime: process`): the command runs on the host in the job's working dir, as
  the job's user (this script drops to it when the sshd runs as root), with the job's env
  (secret values left out: the agent never writes them to disk).

An sftp request (VS Code's file transfers, `scp`) arrives as the path the config gives for the
sftp subsystem (`sftp_marker`) and starts an sftp-server in the same place.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from dataclasses import dataclass
from typing import Any

LOGIN_SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l"
"""A login shell inside a container (its users' shells are not known here)."""
CONTAINER_SFTP = (
    "for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server "
    '/usr/lib/ssh/sftp-server /usr/libexec/sftp-server; do [ -x "$p" ] && exec "$p"; done; '
    "echo 'no sftp-server in this container (install openssh-sftp-server)' >&2; exit 127"
)


@dataclass(frozen=True)
class Session:
    """What to exec: argv, its env and working dir, and the account to switch to (None:
    stay who we are)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    account: pwd.struct_passwd | None = None
    group: int | None = None


class SessionError(Exception):
    """The session cannot start; the message goes to the client's stderr."""


def plan_session(config: dict[str, Any], environ: dict[str, str]) -> Session:
    """The session for `config` (the job's SESSION.json) and the sshd's `environ`."""
    original = environ.get("SSH_ORIGINAL_COMMAND")
    sftp = bool(original) and original == config.get("sftp_marker")
    tty = bool(environ.get("SSH_TTY"))
    if config.get("runtime") == "docker":
        return _docker_session(config, environ, original, sftp, tty)
    return _process_session(config, environ, original, sftp)


def _docker_session(
    config: dict[str, Any], environ: dict[str, str], original: str | None, sftp: bool, tty: bool
) -> Session:
    docker = config.get("docker")
    if not docker:
        raise SessionError("the docker CLI is not on this host: cannot enter the container")
    argv = [docker, "exec", "-i"]
    if tty and not sftp:
        argv.append("-t")
        if environ.get("TERM"):
            argv += ["-e", f"TERM={environ['TERM']}"]
    argv.append(str(config["container"]))
    if sftp:
        argv += ["/bin/sh", "-c", CONTAINER_SFTP]
    elif original:
        argv += ["/bin/sh", "-c", original]
    else:
        argv += ["/bin/sh", "-c", LOGIN_SHELL]
    env = dict(environ)
    env.update({str(k): str(v) for k, v in (config.get("docker_env") or {}).items()})
    return Session(argv, env)


def _process_session(
    config: dict[str, Any], environ: dict[str, str], original: str | None, sftp: bool
) -> Session:
    account, group = _account(config.get("user"))
    shell = (account.pw_shell if account is not None else "") or "/bin/sh"
    if sftp:
        server = config.get("sftp_server")
        if not server:
            raise SessionError("no sftp-server on this host (install openssh-sftp-server)")
        argv = [str(server)]
    elif original:
        argv = [shell, "-c", original]
    else:
        argv = [shell, "-l"]
    env = dict(environ)
    env.update({str(k): str(v) for k, v in (config.get("env") or {}).items()})
    if account is not None:
        env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name, SHELL=shell)
    cwd = config.get("working_dir")
    return Session(argv, env, str(cwd) if cwd else None, account, group)


def _account(user: str | None) -> tuple[pwd.struct_passwd | None, int | None]:
    """The passwd entry of `user[:group]` (names or ids), and the group id; (None, None)
    when the job runs as whoever runs this."""
    if not user:
        return None, None
    name, _, group = user.partition(":")
    try:
        account = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise SessionError(f"the job's user {name!r} does not exist on this host") from None
    gid = account.pw_gid
    if group:
        import grp

        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise SessionError(f"the job's group {group!r} does not exist on this host") from None
    return account, gid


def _become(session: Session) -> None:
    """Switch to the session's account (only root can; anyone else already is the job's
    user, or the job could not have started as another)."""
    account = session.account
    if account is None or os.geteuid() != 0 or account.pw_uid == 0:
        return
    gid = session.group if session.group is not None else account.pw_gid
    os.initgroups(account.pw_name, gid)
    os.setgid(gid)
    os.setuid(account.pw_uid)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        with open(args[0]) as f:
            config = json.load(f)
        session = plan_session(config, dict(os.environ))
        _become(session)
        if session.cwd:
            os.chdir(session.cwd)
        os.execvpe(session.argv[0], session.argv, session.env)
    except (SessionError, OSError, ValueError, IndexError, KeyError) as e:
        print(f"dstack-plan: cannot open a session into the job: {e}", file=sys.stderr)
        return 1
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
