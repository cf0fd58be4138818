"""What both halves of benchmarks/fanout.py share: the namespace hosts, Ansible's inventory,
a project with one SSH fleet, timed runs and the result table.

The hosts are made with the test fixture's code (tests/infra/ssh_hosts.py) on a bridge, prefix
and subnet of their own (`br-dpbench`, `dpbench-*`, 10.215.0.0/24; `br-dpbenchK`, `dpbenchK-*`,
10.215.K.0/24 under `DSTACK_PLAN_SSH_TEST_SLOT=K`), so a test run on the same machine is not
disturbed.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.infra import ssh_hosts  # noqa: E402

# copy k of the network under DSTACK_PLAN_SSH_TEST_SLOT=k, as for the test fixture: a test of
# this benchmark then does not tear down a benchmark running by hand
_SLOT = "" if ssh_hosts.SLOT == 0 else str(ssh_hosts.SLOT)
ssh_hosts.BRIDGE = f"br-dpbench{_SLOT}"
ssh_hosts.PREFIX = f"dpbench{_SLOT}-"
ssh_hosts.SUBNET = f"10.215.{ssh_hosts.SLOT}"
ssh_hosts.INNER = f"10.216.{ssh_hosts.SLOT}"
ssh_hosts.INNER_NET = f"{ssh_hosts.INNER}.0/24"

BIN = Path(sys.executable).parent
ANSIBLE = BIN / "ansible"
DSTACK = BIN / "dstack"
AGENT_DIR_ENV = "DSTACK_PLAN_SSH_AGENT_DIR"  # dstack_plan.project.SSH_AGENT_DIR_ENV

Check = Callable[[subprocess.CompletedProcess[str]], str | None]
"""What a run printed -> None when it did what it should, else what is wrong."""


@dataclass
class Bench:
    """The hosts and the files around them, for as long as `bench()` runs."""

    work: Path
    network: ssh_hosts.SSHTestHosts
    names: tuple[str, ...]
    env: dict[str, str]
    """For dstack and the floor: a home of its own (no known_hosts), no SSH agent, and
    `DSTACK_PLAN_SSH_AGENT_DIR` pointing into `work` (the hosts share this filesystem)."""

    @property
    def key(self) -> Path:
        return self.network.client_key

    @property
    def agent_dir(self) -> Path:
        return Path(self.env[AGENT_DIR_ENV])

    def addresses(self, count: int) -> list[str]:
        """The addresses of the first `count` hosts."""
        return [self.network[n].address for n in self.names[:count]]


@contextmanager
def bench(hosts: int, *, ansible: bool = True, prefix: str = "dstack-fanout-") -> Iterator[Bench]:
    """`hosts` namespace hosts (`b1`...) up; all of it removed at the end, also on Ctrl-C or
    SIGTERM (which is turned into SystemExit so that this cleanup runs). `ansible`: Ansible
    must be in the venv; `prefix`: of the temporary work dir's name."""
    reason = ssh_hosts.available()
    if reason is not None:
        sys.exit(f"cannot make the hosts: {reason}")
    if ansible and not ANSIBLE.exists():
        sys.exit(f"{ANSIBLE} is missing: {BIN / 'pip'} install ansible-core")

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    names = tuple(f"b{i}" for i in range(1, hosts + 1))
    network = ssh_hosts.SSHTestHosts(work / "hosts", names=names)
    home = work / "home"  # no ~/.ssh/known_hosts, no ~/.ansible of the user's
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "LC_ALL": "C.UTF-8"}
    env[AGENT_DIR_ENV] = str(work / "agents")
    env.pop("SSH_AUTH_SOCK", None)
    remove_leftover_links()
    try:
        network.up()
        yield Bench(work, network, names, env)
    finally:
        # a second Ctrl-C must not leave namespaces behind half-removed
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        network.down()  # kills every process in the namespaces: sshd, agents
        remove_leftover_links()
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def remove_leftover_links() -> None:
    """Delete host links a killed run left in the root namespace (they block `up()`)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"v{ssh_hosts.PREFIX}"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def write_project(
    directory: Path, key: Path, addresses: Sequence[str], placement: str = "any"
) -> Path:
    """`directory` holding `fleet.dstack.yml`: one SSH fleet `bench` of `addresses`
    (`placement: cluster` lets multi-node tasks use it)."""
    directory.mkdir(parents=True)
    hosts = "".join(f"    - {a}\n" for a in addresses)
    extra = "" if placement == "any" else f"placement: {placement}\n"
    (directory / "fleet.dstack.yml").write_text(
        f"type: fleet\nname: bench\n{extra}ssh_config:\n  user: root\n"
        f"  identity_file: {key}\n  hosts:\n{hosts}"
    )
    return directory


def ansible_env(b: Bench, directory: Path, addresses: Sequence[str]) -> dict[str, str]:
    """`b.env` with an `ANSIBLE_CONFIG` for `addresses`: forks one a host, pipelining on, the
    interpreter given (no discovery round trip), ControlPersist off (every run connects cold,
    as the others do, and no master connection outlives it)."""
    directory.mkdir(parents=True)
    config = directory / "ansible.cfg"
    (directory / "inventory.ini").write_text(
        "[all]\n" + "".join(f"{a}\n" for a in addresses) + "\n[all:vars]\n"
        f"ansible_user=root\nansible_ssh_private_key_file={b.key}\n"
        "ansible_python_interpreter=/usr/bin/python3\n"
    )
    config.write_text(
        "[defaults]\n"
        f"inventory = {directory / 'inventory.ini'}\nforks = {len(addresses)}\n"
        "host_key_checking = False\ngathering = explicit\nretry_files_enabled = False\n"
        "[ssh_connection]\npipelining = True\n"
        "ssh_args = -C -o ControlMaster=auto -o ControlPersist=no\n"
    )
    return {**b.env, "ANSIBLE_CONFIG": str(config)}


def lines_with(marker: str, count: int) -> Check:
    """A check: exit 0 and `count` stdout lines holding `marker` (one a host)."""

    def check(done: subprocess.CompletedProcess[str]) -> str | None:
        found = sum(1 for line in done.stdout.splitlines() if marker in line)
        return None if found == count else f"{found} lines with {marker!r}, not {count}"

    return check


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path, check: Check) -> float:
    """Wall seconds of one run (interpreter start included); exits when it fails or `check`
    finds something wrong with what it printed."""
    started = time.perf_counter()
    done = subprocess.run(
        list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    elapsed = time.perf_counter() - started
    problem = f"exit {done.returncode}" if done.returncode != 0 else check(done)
    if problem is not None:
        sys.exit(f"{' '.join(argv[:3])} ...: {problem}\n{done.stdout}\n{done.stderr}")
    return elapsed


def print_table(
    title: str, times: dict[str, list[float]], bases: Sequence[str]
) -> dict[str, float]:
    """Median, min and max of each side, and the ratio of its median to each of `bases`'
    medians; the medians."""
    medians = {side: statistics.median(values) for side, values in times.items()}
    print(title)
    header = "{:<22} {:>9} {:>7} {:>7}".format("side", "median s", "min s", "max s")
    print(header + "".join(f" {'x ' + base:>20}" for base in bases))
    for side, values in times.items():
        ratios = "".join(f" {medians[side] / medians[base]:>20.2f}" for base in bases)
        print(f"{side:<22} {medians[side]:>9.3f} {min(values):>7.3f} {max(values):>7.3f}{ratios}")
    return medians
