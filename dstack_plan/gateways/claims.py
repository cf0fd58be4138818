"""The host names each project claims on a gateway's host, kept by its `dstack watch`.

A claim is the symbolic link `routes/<host name>` in the gateway's directory, pointing at
the claiming project's tunnel socket relative to `tunnels/` (`ServedBy.claim_target`); the
relay sends each request to the socket its host name is claimed for
(`proxy/gateway_relay.py`). `ln -s` fails when the link exists, so the host decides: the
first claim of a name holds it, and another project's watch finds it held and says so.
Each watch removes only its own claims (the services it no longer serves there); the
owner's watch also removes the claims of projects its exports no longer share the gateway
with, so revoking an export takes the gateway from that project's services.

    held = await sync_claims(conn, host, routes, "team-b.sock", {"web.example.com"}, keep)
    # held: the wanted names another project holds, {"web.example.com": "team-c.sock"}
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncssh

from dstack_plan.providers.ssh.install import run_command

NO_ROUTES = 3
"""The listing's exit status when the gateway's relay has no `routes/` (installed by a
version before shared gateways)."""


class NoRoutes(Exception):
    """The gateway's directory has no `routes/`: its relay serves only the owner."""


@dataclass(frozen=True)
class ClaimChanges:
    """What one watch changes among a gateway's claims, and what it cannot have."""

    remove: dict[str, str] = field(default_factory=dict)
    """Host name -> the target it points at now (removed only if it still does)."""
    create: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)
    """Wanted host names another project holds -> its target."""


def list_script(routes: str) -> str:
    """A command printing `<host name> <target>` per claim in `routes`."""
    d = shlex.quote(routes)
    return (
        f"[ -d {d} ] || exit {NO_ROUTES}; cd {d} && for f in *; do "
        '[ -L "$f" ] && printf "%s %s\\n" "$f" "$(readlink -- "$f")"; done; true'
    )


def parse_listing(output: str) -> dict[str, str]:
    """Host name -> target, from `list_script`'s output."""
    claims: dict[str, str] = {}
    for line in output.splitlines():
        name, _, target = line.partition(" ")
        if name and target:
            claims[name] = target
    return claims


def changes(
    claims: dict[str, str], target: str, wanted: set[str], evict: Callable[[str], bool]
) -> ClaimChanges:
    """What to change so this project's claims (those pointing at `target`) are `wanted`;
    `evict(target)` says which other projects' claims go too (the owner's exports')."""
    remove = {
        name: t
        for name, t in claims.items()
        if (t == target and name not in wanted) or (t != target and evict(t))
    }
    create = sorted(n for n in wanted if n not in claims or n in remove)
    held = {n: claims[n] for n in wanted if n in claims and claims[n] != target}
    held = {n: t for n, t in held.items() if n not in remove}
    return ClaimChanges(remove, create, held)


def change_script(routes: str, target: str, planned: ClaimChanges) -> str:
    """One command carrying out `planned` in `routes`: a removal only of a link that still
    points where it did, a creation only where no link is (`ln -s` refuses one that is)."""
    steps = [f"cd {shlex.quote(routes)} || exit 1"]
    for name, was in sorted(planned.remove.items()):
        n = shlex.quote(name)
        steps.append(f'[ "$(readlink -- {n})" = {shlex.quote(was)} ] && rm -f -- {n}')
    for name in planned.create:
        steps.append(f"ln -s -- {shlex.quote(target)} {shlex.quote(name)} 2>/dev/null")
    steps.append("true")
    return "; ".join(steps)


async def sync_claims(
    conn: asyncssh.SSHClientConnection,
    host: str,
    routes: str,
    target: str,
    wanted: set[str],
    evict: Callable[[str], bool] = lambda _: False,
) -> dict[str, str]:
    """Make this project's claims in `routes` on `host` the `wanted` host names (see the
    module doc); the wanted names another project holds, with its target. SSHError when the
    host cannot be asked; NoRoutes when the gateway has no `routes/`."""
    status, output = await run_command(
        conn, host, list_script(routes), "listing the gateway's routes", ok=(0, NO_ROUTES)
    )
    if status == NO_ROUTES:
        raise NoRoutes(routes)
    planned = changes(parse_listing(output), target, wanted, evict)
    if planned.remove or planned.create:
        await run_command(
            conn, host, change_script(routes, target, planned), "claiming the services' names"
        )
    return planned.held
