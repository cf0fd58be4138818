"""SSH test hosts: network namespaces with their own addresses, each running OpenSSH `sshd`.

Layout (all created here, torn down at the end; a previous run's leftovers are removed first):

- bridge `br-dpssh` 10.213.0.1/24 in the root namespace; hosts `dpssh-<name>` at 10.213.0.11...
  (`DSTACK_PLAN_SSH_TEST_SLOT=k` makes copy k: `br-dpsshk`, `dpsshk-<name>`, 10.213.k.0/24)
- `jump` is also on a private link 10.214.0.1/30 to `inner` (10.214.0.2), which is NOT on the
  bridge: the root namespace has no route to it, so only a proxy_jump through `jump` reaches it.
- every host has its own ed25519 host key (regenerate one and restart its sshd to test a
  changed key) and accepts the one client key; root's slow `~/.bashrc` is hidden per host.
- every host has a `~/.dstack-plan` of its own (a directory of its own mounted over root's,
  in its mount namespace): what goes there by default (gateways' relays, agents installed
  without `DSTACK_PLAN_SSH_AGENT_DIR`) is the host's alone, as on separate machines, and is
  never another copy's (another test run, or another pytest-xdist worker).
- `bare` logs in with a PATH that has neither python3 nor docker, and forbids TCP forwarding;
  `gpu` and `gpu2` (the last host, so the others keep their addresses) have a fake
  `nvidia-smi` first on its PATH.
- `sysd` looks as if systemd ran there: `DSTACK_PLAN_SYSTEMD_ROOT` points at its own stand-in
  for `/` (with `run/systemd/system/`) and a fake `systemctl` (tests/infra/fake_systemctl.py)
  is first on its PATH. Every other host gets a `DSTACK_PLAN_SYSTEMD_ROOT` without systemd, so
  where the machine itself runs systemd, no test installs a unit into the real one.

Needs root, `ip netns` and /usr/sbin/sshd; `available()` says why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.infra.netns import add_bridge, add_namespace, ip, keygen, plug, remove_network

BASE_SLOT = int(os.environ.get("DSTACK_PLAN_SSH_TEST_SLOT", "0"))
"""The test run's copy of the network (0-9): several test runs side by side (parallel helpers
on one machine) each set their own, so none tears down another's hosts."""


def worker_slot(base: int, worker: str | None) -> int:
    """The copy of the network of one process of a test run: `base` itself in a run without
    workers (a benchmark run by hand may name any copy, 0-255: the third byte of the
    subnet), else 100 + 10 * base + N for pytest-xdist's worker `gwN` (`PYTEST_XDIST_WORKER`),
    so that each worker has hosts of its own and no copy of one run is a copy another run
    (serial, or parallel with another base) uses."""
    if not worker:
        if not 0 <= base <= 255:
            raise ValueError(f"DSTACK_PLAN_SSH_TEST_SLOT={base}: a copy is 0-255")
        return base
    number = int(worker.removeprefix("gw"))
    if not (0 <= base <= 9 and 0 <= number <= 9):
        raise ValueError(
            f"DSTACK_PLAN_SSH_TEST_SLOT={base} with worker {worker}: parallel runs need a base "
            "slot of 0-9 and at most 10 workers (-n 10)"
        )
    return 100 + 10 * base + number


SLOT = worker_slot(BASE_SLOT, os.environ.get("PYTEST_XDIST_WORKER"))
"""This process's copy: bridge `br-dpssh{SLOT}`, namespaces `dpssh{SLOT}-*`, 10.213.SLOT.0/24
(names all within Linux's 15 characters for an interface: see `SSHTestHost.veth`)."""
BRIDGE = "br-dpssh" if SLOT == 0 else f"br-dpssh{SLOT}"
PREFIX = "dpssh-" if SLOT == 0 else f"dpssh{SLOT}-"
SUBNET = f"10.213.{SLOT}"
INNER = f"10.214.{SLOT}"
INNER_NET = f"{INNER}.0/24"
SSHD = "/usr/sbin/sshd"
HOST_DSTACK_DIR = "/root/.dstack-plan"
"""Root's `~/.dstack-plan`, over which each host mounts a directory of its own."""
SYSTEMD_ROOT_ENV = "DSTACK_PLAN_SYSTEMD_ROOT"  # dstack_plan.providers.ssh.systemd.ROOT_ENV

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA Fake A100 (UUID: GPU-fake-0)" ;;
  *) echo "0, NVIDIA Fake A100, 81920, GPU-fake-0" ;;
esac
"""


@dataclass
class SSHTestHost:
    """One namespace host: `address` is what the controller connects to (port 22)."""

    name: str
    address: str
    directory: Path
    sshd_options: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def netns(self) -> str:
        return PREFIX + self.name

    @property
    def veth(self) -> str:
        """Its link's end in the root namespace: `v<netns>`, or where that is longer than the
        15 characters Linux allows an interface name, `v<prefix>` and the last byte of its
        address (a cut name would make `gpu` and `gpu2` of `dpbench170-` one link)."""
        name = f"v{self.netns}"
        if len(name) > 15:
            name = f"v{PREFIX}{self.address.rsplit('.', 1)[1]}"
        if len(name) > 15:
            raise ValueError(f"no interface name within 15 characters for {self.netns}")
        return name

    @property
    def host_key(self) -> Path:
        return self.directory / "host_ed25519"

    def public_host_key(self) -> str:
        return (self.directory / "host_ed25519.pub").read_text().split()[1]


def available() -> str | None:
    """None when namespace hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "SSH test hosts need root (network namespaces)"
    if not Path(SSHD).exists():
        return f"SSH test hosts need OpenSSH's {SSHD} (Debian: openssh-server)"
    if shutil.which("ip") is None:
        return "SSH test hosts need `ip` (Debian: iproute2)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def slot_port(index: int) -> int:
    """A TCP port on this machine that only this copy's tests use (`index` 0-9): 20000 +
    10 * SLOT + index, below the ephemeral range (no outgoing connection takes it), for a
    test that needs a port it knows beforehand and binds on the machine itself."""
    if not 0 <= index <= 9:
        raise ValueError(f"slot_port({index}): a copy has ports 0-9")
    return 20000 + 10 * SLOT + index


class SSHTestHosts:
    """The whole test network; `up()` builds it, `down()` removes it (and any leftovers)."""

    def __init__(self, directory: Path, names: tuple[str, ...] = ("h1", "h2", "h3")):
        self.directory = directory
        self.client_key = directory / "client_ed25519"
        self.hosts: dict[str, SSHTestHost] = {}
        for i, name in enumerate((*names, "bare", "gpu", "jump", "sysd", "gpu2")):
            self.hosts[name] = SSHTestHost(name, f"{SUBNET}.{11 + i}", directory / name)
        self.hosts["inner"] = SSHTestHost("inner", f"{INNER}.2", directory / "inner")
        self.fake_bin = directory / "fake-bin"
        self.bare_bin = directory / "bare-bin"
        self.systemd_bin = directory / "systemd-bin"
        self.systemd_root = directory / "systemd-root"
        """`sysd`'s stand-in for `/`: its unit files, and the fake systemctl's log."""

    def __getitem__(self, name: str) -> SSHTestHost:
        return self.hosts[name]

    # -- building

    def up(self) -> SSHTestHosts:
        self.down()  # a killed run may have left namespaces, a bridge or sshd processes behind
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        Path(HOST_DSTACK_DIR).mkdir(exist_ok=True)  # where each host mounts its own
        self.directory.mkdir(parents=True, exist_ok=True)
        keygen(self.client_key)
        (self.directory / "authorized_keys").write_text(
            (self.directory / "client_ed25519.pub").read_text()
        )
        (self.directory / "empty_bashrc").write_text("")
        self._make_bins()
        add_bridge(BRIDGE, f"{SUBNET}.1/24")
        for host in self.hosts.values():
            add_namespace(host.netns)
        for host in self.hosts.values():
            if host.name != "inner":
                plug(host.netns, host.veth, BRIDGE, f"{host.address}/24")
        jump, inner = self.hosts["jump"].netns, self.hosts["inner"].netns
        peer = ("peer", "name", "eth0", "netns", inner)
        ip("-n", jump, "link", "add", "eth1", "type", "veth", *peer)
        ip("-n", jump, "addr", "add", f"{INNER}.1/30", "dev", "eth1")
        ip("-n", inner, "addr", "add", f"{INNER}.2/30", "dev", "eth0")
        ip("-n", jump, "link", "set", "eth1", "up")
        ip("-n", inner, "link", "set", "eth0", "up")
        # without this the root namespace would send packets for `inner` to its default
        # gateway (off the machine); now a direct connection fails at once, locally
        ip("route", "add", "unreachable", INNER_NET)
        # sshd takes the first SetEnv line only: every variable of a host goes on one
        no_systemd = f"{SYSTEMD_ROOT_ENV}={self.directory / 'no-systemd'}"
        for host in self.hosts.values():
            host.sshd_options = [f"SetEnv {no_systemd}"]
        self.hosts["bare"].sshd_options = [
            f"SetEnv PATH={self.bare_bin} {no_systemd}",
            "AllowTcpForwarding no",
        ]
        for gpu in ("gpu", "gpu2"):
            self.hosts[gpu].sshd_options = [
                f"SetEnv PATH={self.fake_bin}:/usr/bin:/bin {no_systemd}"
            ]
        self.hosts["sysd"].sshd_options = [
            f"SetEnv PATH={self.systemd_bin}:/usr/bin:/bin {SYSTEMD_ROOT_ENV}={self.systemd_root}"
        ]
        for host in self.hosts.values():
            host.directory.mkdir(parents=True, exist_ok=True)
            keygen(host.host_key)
            self.start(host.name, wait=False)
        for host in self.hosts.values():
            self._wait_listening(host)
        return self

    def _make_bins(self) -> None:
        self.fake_bin.mkdir(exist_ok=True)
        self.systemd_bin.mkdir(exist_ok=True)
        systemctl = self.systemd_bin / "systemctl"
        shutil.copyfile(Path(__file__).with_name("fake_systemctl.py"), systemctl)
        systemctl.chmod(0o755)
        shutil.rmtree(self.systemd_root, ignore_errors=True)  # no units of an earlier run
        (self.systemd_root / "run/systemd/system").mkdir(parents=True)
        (self.systemd_root / "etc/systemd/system").mkdir(parents=True)
        smi = self.fake_bin / "nvidia-smi"
        smi.write_text(FAKE_NVIDIA_SMI)
        smi.chmod(0o755)
        # a PATH with the usual tools but no python3 and no docker
        self.bare_bin.mkdir(exist_ok=True)
        for directory in (Path("/usr/bin"), Path("/bin")):
            for tool in directory.iterdir():
                link = self.bare_bin / tool.name
                if tool.name.startswith(("python", "docker", "sudo")) or link.exists():
                    continue
                link.symlink_to(tool)

    def _config(self, host: SSHTestHost) -> Path:
        lines = [
            f"ListenAddress {host.address}",
            "Port 22",
            f"HostKey {host.host_key}",
            f"PidFile {host.directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.directory / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 100:30:200",
            "MaxSessions 50",
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            *host.sshd_options,
        ]
        config = host.directory / "sshd_config"
        config.write_text("\n".join(lines) + "\n")
        return config

    # -- changing one host

    def start(self, name: str, wait: bool = True) -> None:
        """Start (or restart) the host's sshd."""
        host = self.hosts[name]
        self.stop(name)
        config = self._config(host)
        home_dir = host.directory / "dot-dstack-plan"
        home_dir.mkdir(exist_ok=True)
        script = (
            f"hostname {host.name}; mount --bind {self.directory / 'empty_bashrc'} /root/.bashrc;"
            f" mount --bind {home_dir} {HOST_DSTACK_DIR} && exec {SSHD} -D -e -f {config}"
        )
        with open(host.directory / "sshd.log", "ab") as log:
            # `ip netns exec` gives a private mount namespace (the bind mount stays local) and
            # `unshare --uts` a private hostname; both exec, so the pid is sshd's
            host.process = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", script],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if wait:
            self._wait_listening(host)

    def stop(self, name: str) -> None:
        """Stop the host's sshd (connections are then refused)."""
        host = self.hosts[name]
        if host.process is not None:
            host.process.kill()
            host.process.wait()
            host.process = None

    def cut_off(self, name: str) -> None:
        """Cut the host off from the controller while everything else on it runs on (its
        agent, its jobs): its sshd is stopped and every SSH connection to it is dropped
        (`stop` leaves open connections up). `start` brings it back."""
        self.stop(name)
        pids = subprocess.run(
            ["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True
        )
        for pid in pids.stdout.split():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm.startswith("sshd") or comm == "sftp-server":
                    os.kill(int(pid), 9)
            except (OSError, ValueError):
                continue  # gone meanwhile

    def link(self, name: str, up: bool) -> None:
        """Take the host's network link down (packets to it are lost, nothing is refused:
        a cable pulled, a host powered off) or up again."""
        ip("-n", self.hosts[name].netns, "link", "set", "eth0", "up" if up else "down")

    def throttle(self, name: str, mbit: int | None) -> None:
        """Limit the host's link to `mbit` Mbit/s both ways (a token bucket on each end of
        its veth: a slow NIC or a far switch), or lift the limit (None)."""
        host = self.hosts[name]
        ends = (["-n", host.netns, "eth0"], [host.veth])
        for *where, dev in ends:
            if mbit is None:
                subprocess.run(["tc", *where, "qdisc", "del", "dev", dev, "root"], check=False)
                continue
            rate = ["tbf", "rate", f"{mbit}mbit", "burst", "32kbit", "latency", "50ms"]
            subprocess.run(
                ["tc", *where, "qdisc", "replace", "dev", dev, "root", *rate],
                check=True,
                capture_output=True,
            )

    def new_host_key(self, name: str) -> None:
        """Give the host a new host key and restart its sshd."""
        host = self.hosts[name]
        host.host_key.unlink()
        Path(f"{host.host_key}.pub").unlink()
        keygen(host.host_key)
        self.start(name)

    def _wait_listening(self, host: SSHTestHost) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            listening = subprocess.run(
                ["ip", "netns", "exec", host.netns, "ss", "-Hltn", "sport", "= :22"],
                capture_output=True,
                text=True,
            )
            if listening.stdout.strip():
                return
            if host.process is not None and host.process.poll() is not None:
                break
            time.sleep(0.05)
        log = (host.directory / "sshd.log").read_text(errors="replace")
        raise RuntimeError(f"sshd of test host {host.name} did not start:\n{log}")

    # -- tearing down

    def down(self) -> None:
        """Remove every namespace host, including ones a previous run left behind."""
        for host in self.hosts.values():
            if host.process is not None:
                self.stop(host.name)
        remove_network(PREFIX, (h.veth for h in self.hosts.values()), BRIDGE)
        ip("route", "del", "unreachable", INNER_NET, check=False)
