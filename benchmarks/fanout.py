"""Fan-out over SSH: `dstack exec` against Ansible and a bare asyncssh loop, and a fresh SSH
fleet apply against `ansible -m setup`, on namespace hosts.

    python benchmarks/fanout.py [-n 5] [--hosts 15] [--apply-hosts 10] [--only exec|apply]

Needs root (the hosts are network namespaces running sshd, see benchmarks/fanout_hosts.py) and
ansible-core in the venv (`pip install ansible-core`). Every wall time includes the
interpreter's start; the sides of each half alternate, round by round.

Exec half, each round: `dstack exec -- uname -a` (a project with one 15-host SSH fleet);
`ansible all -m command -a 'uname -a'` (forks 15, pipelining, interpreter given, ControlPersist
off: every run connects cold); a bare asyncssh loop in a fresh `python -c` (the practical
floor). Targets: exec <= 0.25x Ansible, <= 2x the floor.

Apply half (benchmarks/fanout_apply.py), each round on 10 of the hosts: a fresh `dstack apply
-y` (no agent, no state: pre-flight, agent upload, start, facts); `ansible all -m setup`; a
re-apply of the unchanged fleet (a no-op) and `dstack plan`. Targets: fresh apply no slower
than `ansible -m setup`, re-apply under 1 s.

Exit code 0 when every target of the halves run was met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

import fanout_hosts
from fanout_apply import run_apply_half
from fanout_hosts import Bench, ansible_env, bench, lines_with, print_table, timed, write_project

ANSIBLE_TARGET = 0.25
FLOOR_TARGET = 2.0
EXEC, ANSIBLE, FLOOR = "dstack exec", "ansible -m command", "bare asyncssh"

FLOOR_SCRIPT = """
import asyncio, sys, asyncssh
async def one(host):
    async with asyncssh.connect(host, username="root", client_keys=[sys.argv[1]],
                                known_hosts=None, config=None, agent_path=None) as conn:
        return host, (await conn.run("uname -a", check=True)).stdout
async def main():
    for host, out in await asyncio.gather(*(one(h) for h in sys.argv[2:])):
        sys.stdout.write(f"{host} | {out}")
asyncio.run(main())
"""


def run_exec_half(b: Bench, hosts: int, rounds: int) -> dict[str, bool]:
    """The exec half on the first `hosts` of `b`'s hosts: target -> whether it was met."""
    addresses = b.addresses(hosts)
    project = write_project(b.work / "exec-project", b.key, addresses)
    sides = {
        EXEC: ([str(fanout_hosts.DSTACK), "exec", str(project), "--", "uname", "-a"], b.env),
        ANSIBLE: (
            [str(fanout_hosts.ANSIBLE), "all", "-m", "command", "-a", "uname -a"],
            ansible_env(b, b.work / "exec-ansible", addresses),
        ),
        FLOOR: ([sys.executable, "-c", FLOOR_SCRIPT, str(b.key), *addresses], b.env),
    }
    answered = lines_with("Linux", hosts)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(rounds + 1):  # round 0 warms up: page cache, .pyc files
        for side, (argv, env) in sides.items():
            elapsed = timed(argv, env, b.work, answered)
            if round_:
                times[side].append(elapsed)

    title = f"{hosts} hosts, `uname -a`, median of {rounds} alternating rounds"
    medians = print_table(title, times, [ANSIBLE, FLOOR])
    vs_ansible, vs_floor = medians[EXEC] / medians[ANSIBLE], medians[EXEC] / medians[FLOOR]
    met = {
        f"exec <= {ANSIBLE_TARGET}x Ansible": vs_ansible <= ANSIBLE_TARGET,
        f"exec <= {FLOOR_TARGET:g}x floor": vs_floor <= FLOOR_TARGET,
    }
    print(
        f"dstack exec on {hosts} hosts {medians[EXEC]:.3f} s: {vs_ansible:.2f}x Ansible "
        f"(target <= {ANSIBLE_TARGET}x), {vs_floor:.2f}x the asyncssh floor "
        f"(target <= {FLOOR_TARGET:g}x) -> {'PASS' if all(met.values()) else 'FAIL'}"
    )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="rounds of each half (default 5)")
    parser.add_argument("--hosts", type=int, default=15, help="exec hosts (default 15)")
    parser.add_argument("--apply-hosts", type=int, default=10, help="fleet hosts (default 10)")
    parser.add_argument("--only", choices=("exec", "apply"), help="run one half only")
    args = parser.parse_args()
    met: dict[str, bool] = {}
    needed = {"exec": args.hosts, "apply": args.apply_hosts}.get(args.only or "")
    with bench(needed or max(args.hosts, args.apply_hosts)) as b:
        if args.only != "apply":
            met.update(run_exec_half(b, args.hosts, args.n))
            print()
        if args.only != "exec":
            met.update(run_apply_half(b, args.apply_hosts, args.n))
            print()
    missed = [target for target, ok in met.items() if not ok]
    print(
        f"fanout: {len(met) - len(missed)} of {len(met)} targets met"
        + (f"; missed: {', '.join(missed)}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the hosts are gone already: `bench()` cleaned up
        sys.exit("interrupted")
