"""A real multi-node Slurm cluster for tests: network namespaces, each one host of the cluster.

Layout (all created here, torn down at the end; a previous run's leftovers are removed first):

- bridge `br-dpslurm` 10.215.0.1/24 in the root namespace; hosts `dpslurm-<name>` on it
  (`DSTACK_PLAN_SSH_TEST_SLOT=k`, and each pytest-xdist worker, make copy `SLOT` as for the
  SSH test hosts, tests/infra/ssh_hosts.py: `br-dpslurm{SLOT}`, `dpslurm{SLOT}-<name>`,
  10.215.SLOT.0/24, cluster `dptest{SLOT}`).
- `login` (.10) runs `slurmctld` and an OpenSSH `sshd` on port 22: the cluster's login node,
  which the product reaches over SSH with the one client key (`client_ed25519` in the
  cluster's directory); its sessions get `SLURM_CONF`, so `sbatch`, `squeue`, `scontrol` and
  `scancel` work there. Root's slow `~/.bashrc` is hidden, as on the SSH test hosts.
- compute nodes, each running `slurmd`: `cpu1` (.11) and `cpu2` (.12) in partition `cpu`
  (the default), `gpu1` (.13) and `gpu2` (.14) in partition `gpu`, each with two fake GPUs:
  GRES `gpu:2` (no autodetection) whose device files are stand-ins in the cluster's `dev/`
  (character devices like /dev/null: Slurm 22.05 drops a GPU without a File=). Slurm
  schedules and counts them, and a job with `--gres=gpu:2` gets SLURM_GPUS_ON_NODE=2,
  SLURM_JOB_GPUS=0,1, CUDA_VISIBLE_DEVICES=0,1 and GPU_DEVICE_ORDINAL=0,1 (its steps also
  SLURM_STEP_GPUS=0,1); no process can use them. Every node has CPUs=2 and
  RealMemory=2000 (MB), whatever the machine has (`config_overrides`); a job without
  `--mem` gets 500 MB a CPU (DefMemPerCPU).
- every daemon runs in its host's namespace with the host's name as its hostname (a UTS
  namespace of its own); they reach each other over the bridge (srun's step I/O included).
- one `munged` for the whole machine (its socket, /run/munge/munge.socket.2, is on the
  filesystem every namespace shares): started here when none answers, never stopped here
  (another test run may use it).
- the filesystem is shared too, as on a cluster with a shared home: a job's output file
  under the cluster's directory is readable from the test.
- everything of the cluster's (slurm.conf, gres.conf, state, spool, logs, pid files, keys)
  is in its directory; `slurmctld.log` and `slurmd-<node>.log` tell why a daemon failed.

Finished jobs leave `squeue` at once but `scontrol show job` knows them for MinJobAge=300 s.
No accounting (no slurmdbd): `sacct` has nothing. ReturnToService=1: a node set DOWN by hand
stays down until `resume`; one DOWN for not responding comes back when its slurmd registers.
`up()` takes about 3.5 s, most of it waiting for slurmctld's first scheduling pass.

Needs root, `ip netns`, /usr/sbin/sshd, Slurm (slurmctld, slurmd, sbatch) and munge;
`available()` says why not.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.infra.netns import add_bridge, add_namespace, keygen, plug, remove_network
from tests.infra.ssh_hosts import SLOT, SSHD

BRIDGE = "br-dpslurm" if SLOT == 0 else f"br-dpslurm{SLOT}"
PREFIX = "dpslurm-" if SLOT == 0 else f"dpslurm{SLOT}-"
SUBNET = f"10.215.{SLOT}"
CLUSTER_NAME = f"dptest{SLOT}"
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGED = "/usr/sbin/munged"
READY_TIMEOUT = 60.0
"""How long a daemon may take to come up (a readiness poll: on an idle machine it takes
well under that; the deadline only bounds a failure)."""

NODES = {"cpu1": 11, "cpu2": 12, "gpu1": 13, "gpu2": 14}
"""Compute nodes and the last byte of their addresses."""
PARTITIONS = {"cpu": ("cpu1", "cpu2"), "gpu": ("gpu1", "gpu2")}
GPUS_PER_NODE = 2
SLURMCTLD_PORT = 6817  # Slurm's defaults, each in its host's own network namespace
SLURMD_PORT = 6818


@dataclass
class SlurmHost:
    """One namespace host of the cluster."""

    name: str
    address: str
    process: subprocess.Popen[bytes] | None = None
    """Its Slurm daemon (slurmctld on `login`, slurmd on a compute node)."""

    @property
    def netns(self) -> str:
        return PREFIX + self.name

    @property
    def veth(self) -> str:
        """Its link's end in the root namespace: `vdpsl{SLOT}-{last byte of its address}`,
        within Linux's 15 characters for an interface name for any slot (0-255)."""
        name = f"vdpsl{SLOT}-{self.address.rsplit('.', 1)[1]}"
        if len(name) > 15:
            raise ValueError(f"interface name {name} is longer than 15 characters")
        return name


def available() -> str | None:
    """None when the cluster can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "the Slurm test cluster needs `ip` (Debian: iproute2)"
    if not Path(SSHD).exists():
        return f"the Slurm test cluster needs OpenSSH's {SSHD} (Debian: openssh-server)"
    for tool, package in (
        ("slurmctld", "slurmctld"),
        ("slurmd", "slurmd"),
        ("sbatch", "slurm-client"),
        ("munged", "munge"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
    ):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"the Slurm test cluster needs `{tool}` (Debian: {package}, or slurm-wlm)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"


class SlurmTestCluster:
    """The whole cluster; `up()` builds it, `down()` removes it (and any leftovers)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.cluster_name = CLUSTER_NAME
        self.client_key = directory / "client_ed25519"
        self.conf = directory / "slurm.conf"
        self.hosts_file = directory / "hosts"
        """The hosts' /etc/hosts (mounted over the machine's in each namespace): the cluster's
        names resolve there, and no Slurm lookup of one goes to the machine's DNS."""
        self.login = SlurmHost("login", f"{SUBNET}.10")
        self.hosts: dict[str, SlurmHost] = {"login": self.login}
        for name, last in NODES.items():
            self.hosts[name] = SlurmHost(name, f"{SUBNET}.{last}")
        self.sshd: subprocess.Popen[bytes] | None = None
        self._slurmctld_log_start = 0

    @property
    def login_address(self) -> str:
        return self.login.address

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(NODES)

    def login_host_key(self) -> str:
        """The login node's public host key (base64, as in known_hosts)."""
        return (self.directory / "host_ed25519.pub").read_text().split()[1]

    # -- building

    def up(self) -> SlurmTestCluster:
        self.down()  # a killed run may have left namespaces, a bridge or daemons behind
        ensure_munge()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "spool", "run"):
            # a fresh cluster: slurmctld would recover an earlier up()'s nodes and jobs
            shutil.rmtree(self.directory / sub, ignore_errors=True)
            (self.directory / sub).mkdir()
        self._write_config()
        self._network()
        self._start_slurmctld()
        self._start_sshd()
        self._wait_slurmctld()  # a slurmd that finds none retries its registration later
        for name in NODES:
            self.start_node(name, wait=False)
        self._wait_sshd()
        self.wait_nodes_idle(READY_TIMEOUT)
        self._wait_scheduler()
        return self

    def _network(self) -> None:
        add_bridge(BRIDGE, f"{SUBNET}.1/24")
        for host in self.hosts.values():
            add_namespace(host.netns)
            plug(host.netns, host.veth, BRIDGE, f"{host.address}/24")

    def _write_config(self) -> None:
        d = self.directory
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost=login({self.login.address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            # slurmd kills the process its pid file names: each node needs its own file
            f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            f"PlugStackConfig={d / 'plugstack.conf'}",  # none of the machine's SPANK plugins
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=500",  # a job without --mem takes 500 MB a CPU, not the whole node
            "SchedulerType=sched/backfill",
            # start a batch job when it is submitted, not up to 3 s later: `sbatch --wait`
            # polls after 2 s, then after 8 more, so a job done within 2 s returns in 2 s
            "SchedulerParameters=batch_sched_delay=0",
            # 1, not 2: with 2 a node set DOWN by hand returns to service at its next ping
            # (seconds later: "node_did_resp: node cpu2 returned to service"), so no test
            # could keep one down; with 1 only a node DOWN for not responding comes back
            "ReturnToService=1",
            # the nodes report the machine's hardware; the configured CPUs/memory count
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",  # slurmctld complains of a missing mail program otherwise
            "GresTypes=gpu",
            # short timeouts: tests stop nodes and kill jobs
            "SlurmdTimeout=30",
            "SlurmctldTimeout=30",
            "MessageTimeout=10",
            "KillWait=2",
            "InactiveLimit=0",
            "Waittime=0",
            "MinJobAge=300",  # finished jobs stay in `scontrol show job` for 5 minutes
            "TCPTimeout=5",
        ]
        cpus = "CPUs=2 RealMemory=2000 State=UNKNOWN"
        for name, last in NODES.items():
            gres = f" Gres=gpu:{GPUS_PER_NODE}" if name.startswith("gpu") else ""
            lines.append(
                f"NodeName={name} NodeAddr={SUBNET}.{last} NodeHostname={name} {cpus}{gres}"
            )
        for partition, nodes in PARTITIONS.items():
            default = "YES" if partition == "cpu" else "NO"
            lines.append(
                f"PartitionName={partition} Nodes={','.join(nodes)} Default={default} "
                "State=UP MaxTime=INFINITE"
            )
        self.conf.write_text("\n".join(lines) + "\n")
        # Slurm 22.05's gres/gpu drops a GPU without File= ("Removing file-less GPU"), and
        # the node registers 0 of its 2 (INVAL): each fake GPU is a device file, a character
        # device like /dev/null's (1, 3) in the cluster's directory (a regular file draws
        # "not a valid character or block device" errors)
        dev = d / "dev"
        dev.mkdir(exist_ok=True)
        for index in range(GPUS_PER_NODE):
            device = dev / f"nvidia{index}"
            if not device.exists():
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (d / "gres.conf").write_text(
            "AutoDetect=off\n"
            f"NodeName=gpu[1-2] Name=gpu File={dev}/nvidia[0-{GPUS_PER_NODE - 1}]\n"
        )
        (d / "plugstack.conf").write_text("")
        (d / "empty_bashrc").write_text("")
        names = [f"{host.address} {host.name}" for host in self.hosts.values()]
        self.hosts_file.write_text(
            "\n".join(["127.0.0.1 localhost", "::1 localhost ip6-localhost", *names]) + "\n"
        )

    def _spawn(
        self, host: SlurmHost, command: str, log: Path, hide_bashrc: bool = False
    ) -> subprocess.Popen[bytes]:
        """`command` (a shell command line that ends by exec'ing the daemon) in the host's
        namespace (`host_argv`); every step execs, so the pid is the daemon's."""
        script = command
        if hide_bashrc:
            bashrc = self.directory / "empty_bashrc"
            script = f"{{ mount --bind {bashrc} /root/.bashrc || true; }} && {command}"
        with open(log, "ab") as out:
            return subprocess.Popen(
                self.host_argv(host.name, "sh", "-c", script),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "SLURM_CONF": str(self.conf)},
            )

    def host_argv(self, host: str, *argv: str) -> list[str]:
        """`argv` as run on a host: in its network namespace, with its name as hostname (a UTS
        namespace of its own) and the cluster's /etc/hosts (a mount namespace of its own).

        Not `ip netns exec`: it mounts a sysfs of the namespace's own over /sys, which hides
        /sys/fs/cgroup, and slurmd (22.05) will not start without its cgroup plugin, even with
        proctrack/linuxproc and task/none. `nsenter --net` leaves /sys as it is."""
        script = f'hostname "$0" && mount --bind {self.hosts_file} /etc/hosts && exec "$@"'
        return [
            "nsenter", f"--net=/run/netns/{self.hosts[host].netns}",
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script, host, *argv,
        ]  # fmt: skip

    def _start_slurmctld(self) -> None:
        log = self.directory / "slurmctld.log"
        self._slurmctld_log_start = log.stat().st_size if log.exists() else 0
        self.login.process = self._spawn(
            self.login,
            f"exec slurmctld -D -f {self.conf}",
            self.directory / "slurmctld.out",
        )

    def start_node(self, name: str, wait: bool = True) -> None:
        """Start the node's slurmd (it registers with slurmctld at once); with `wait`,
        until it answers (not responding no more)."""
        host = self.hosts[name]
        self.stop_node(name)
        (self.directory / "spool" / name).mkdir(parents=True, exist_ok=True)
        host.process = self._spawn(
            host,
            f"exec slurmd -D -N {name} -f {self.conf}",
            self.directory / f"slurmd-{name}.out",
        )
        if wait:
            self._wait_node_responding(name)

    def stop_node(self, name: str) -> None:
        """Stop the node's slurmd (its running jobs' slurmstepd live on, as when a real
        slurmd restarts); slurmctld marks it not responding after SlurmdTimeout."""
        host = self.hosts[name]
        if host.process is not None:
            host.process.terminate()
            try:
                host.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                host.process.kill()
                host.process.wait()
            host.process = None

    def restart_node(self, name: str) -> None:
        """Restart the node's slurmd and wait until it answers slurmctld again."""
        self.stop_node(name)
        self.start_node(name)

    def _start_sshd(self) -> None:
        d = self.directory
        keygen(self.client_key)
        keygen(d / "host_ed25519")
        (d / "authorized_keys").write_text((d / "client_ed25519.pub").read_text())
        lines = [
            f"ListenAddress {self.login.address}",
            "Port 22",
            f"HostKey {d / 'host_ed25519'}",
            f"PidFile {d / 'run' / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 100:30:200",
            "MaxSessions 50",
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            # sshd takes the first SetEnv line only: every variable goes on this one
            f"SetEnv SLURM_CONF={self.conf}",
        ]
        config = d / "sshd_config"
        config.write_text("\n".join(lines) + "\n")
        self.sshd = self._spawn(
            self.login, f"exec {SSHD} -D -e -f {config}", d / "sshd.log", hide_bashrc=True
        )

    def stop_login(self) -> None:
        """Stop the login node's sshd: new SSH connections are refused (Slurm runs on)."""
        if self.sshd is not None:
            self.sshd.kill()
            self.sshd.wait()
            self.sshd = None

    def start_login(self) -> None:
        """Start the login node's sshd again (the same host key)."""
        self._start_sshd()
        self._wait_sshd()

    # -- waiting

    def _check_alive(self, name: str) -> None:
        host = self.hosts[name]
        if host.process is not None and host.process.poll() is not None:
            daemon = "slurmctld" if name == "login" else f"slurmd-{name}"
            raise RuntimeError(
                f"{daemon} of the Slurm test cluster exited ({host.process.returncode}):\n"
                f"{_tail(self.directory / f'{daemon}.out')}\n"
                f"--- {daemon}.log:\n{_tail(self.directory / f'{daemon}.log')}"
            )

    def _wait_slurmctld(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive("login")
            if self._listening("login", SLURMCTLD_PORT):
                return
            time.sleep(0.02)
        raise RuntimeError(
            "slurmctld of the Slurm test cluster does not listen:\n"
            f"{_tail(self.directory / 'slurmctld.log')}"
        )

    def _wait_scheduler(self) -> None:
        """Until slurmctld's scheduler has run once (it logs its SchedulerParameters then),
        about 3 s after slurmctld starts: a job submitted before waits for that run, and
        the first `sbatch --wait` of a session would take 10 s instead of 2 (it polls after
        2 s, then 8 more). Only for speed: not seeing the line within 15 s is no error."""
        log = self.directory / "slurmctld.log"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with open(log, "rb") as f:
                f.seek(self._slurmctld_log_start)  # this slurmctld's lines only
                if b"SchedulerParameters=" in f.read():
                    return
            time.sleep(0.1)

    def _wait_sshd(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self._listening("login", 22):
                return
            if self.sshd is not None and self.sshd.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(
            f"sshd of the Slurm login node did not start:\n{_tail(self.directory / 'sshd.log')}"
        )

    def node_states(self) -> dict[str, str]:
        """Each node's state as `sinfo` has it (`idle`, `alloc`, `down*`, `drain`...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        states: dict[str, str] = {}
        for line in out.stdout.splitlines():
            if len(line.split()) == 2:
                node, state = line.split()
                states[node] = state
        return states

    def wait_nodes_idle(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until every node is idle (`sinfo`); RuntimeError with the logs after
        `timeout` seconds (a readiness deadline, not a speed expectation)."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name in self.hosts:
                self._check_alive(name)
            states = self.node_states()
            if sorted(states) == sorted(NODES) and set(states.values()) == {"idle"}:
                return
            time.sleep(0.1)
        logs = "\n".join(
            f"--- slurmd-{name}.log:\n{_tail(self.directory / f'slurmd-{name}.log', 10)}"
            for name in NODES
        )
        raise RuntimeError(
            f"Slurm test cluster nodes not idle after {timeout} s: {states}\n"
            f"--- slurmctld.log:\n{_tail(self.directory / 'slurmctld.log')}\n{logs}"
        )

    def _wait_node_responding(self, name: str) -> None:
        """Until the node's slurmd listens and slurmctld has it responding (a node that was
        marked not responding is so again once the new slurmd registers)."""
        deadline = time.monotonic() + READY_TIMEOUT
        state = ""
        while time.monotonic() < deadline:
            self._check_alive(name)
            self._check_alive("login")
            if self._listening(name, SLURMD_PORT):
                out = self.scontrol("show", "node", name, check=False).stdout
                state = next(
                    (w.split("=", 1)[1] for w in out.split() if w.startswith("State=")), ""
                )
                if state and "NOT_RESPONDING" not in state and not state.startswith("UNKNOWN"):
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"slurmd of {name} does not answer slurmctld (State={state}):\n"
            f"{_tail(self.directory / f'slurmd-{name}.log')}"
        )

    def _listening(self, host: str, port: int) -> bool:
        netns = f"--net=/run/netns/{self.hosts[host].netns}"
        listening = subprocess.run(
            ["nsenter", netns, "ss", "-Hltn", "sport", f"= :{port}"],
            capture_output=True,
            text=True,
        )
        return bool(listening.stdout.strip())

    # -- using

    def run(
        self, *argv: str, host: str = "login", check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in a host's namespace, with its hostname and SLURM_CONF set."""
        result = subprocess.run(
            self.host_argv(host, *argv),
            capture_output=True,
            text=True,
            env={**os.environ, "SLURM_CONF": str(self.conf)},
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} on {host} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("scontrol", *args, check=check)

    def set_node_state(self, node: str, state: str, reason: str = "test") -> None:
        """`scontrol update`: e.g. state `down` or `drain` (which need a reason)."""
        self.scontrol("update", f"nodename={node}", f"state={state}", f"reason={reason}")

    def resume(self, node: str) -> None:
        self.scontrol("update", f"nodename={node}", "state=resume")

    # -- tearing down

    def down(self) -> None:
        """Remove the cluster, including what a previous run of this slot left behind
        (munged stays: it is the machine's)."""
        if self.sshd is not None:
            self.sshd.kill()
            self.sshd.wait()
            self.sshd = None
        for host in self.hosts.values():
            if host.process is not None:
                host.process.kill()
                host.process.wait()
                host.process = None
        remove_network(PREFIX, (h.veth for h in self.hosts.values()), BRIDGE)


def munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        if cred.returncode != 0:
            return False
        check = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return check.returncode == 0


def ensure_munge() -> None:
    """Make sure the machine's munged answers: start it (as the munge user, with a key made
    here if there is none) when it does not. Another test run may start it at the same
    time: one of the two exits (the socket is locked), and both find it answering."""
    if munge_works():
        return
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mungekey", "--create", "--keyfile", str(MUNGE_KEY)], check=True)
        shutil.chown(MUNGE_KEY, "munge", "munge")
        MUNGE_KEY.chmod(0o400)
    run_dir = MUNGE_SOCKET.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    # munged forks and detaches; its output goes to its own log, never to a pipe of ours
    subprocess.run(
        ["runuser", "-u", "munge", "--", MUNGED],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if munge_works():
            return
        time.sleep(0.1)
    log = _tail(Path("/var/log/munge/munged.log"))
    raise RuntimeError(f"munged does not answer (`munge -n | unmunge`):\n{log}")
