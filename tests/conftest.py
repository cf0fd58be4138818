from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.infra.network_guard import guarded_connect, guarded_getaddrinfo

REPO_ROOT = Path(__file__).resolve().parent.parent

# A developer's shell may point `dstack` at an agent of theirs: no test may start, use or stop
# it (a test that needs an agent makes its own, in a directory of its own).
os.environ.pop("DSTACK_PLAN_AGENT_DIR", None)

# No test may depend on wall-clock time: on a loaded machine (or beside parallel workers) one
# example can take longer than Hypothesis's default 200 ms deadline without anything wrong.
settings.register_profile("no-clock", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("no-clock")


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker, take Ctrl-C back: execnet starts workers with SIGINT
    ignored, and an ignored signal stays ignored across exec, so every process a test starts
    (`dstack watch`, `top`, the benchmarks) would ignore the SIGINT the test sends it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the longest tests first (the schedulers hand tests out in
    the order the workers collected them): those marked `slow`, then the end-to-end tests
    on the namespace hosts, the other end-to-end tests, the integration tests, and the unit
    tests last, which fill the gaps at the end. A stable sort: within one rank, the file
    order stays."""
    if hasattr(config, "workerinput"):
        items.sort(key=_expected_length_rank)


def _expected_length_rank(item: pytest.Item) -> int:
    if item.get_closest_marker("slow") is not None:
        return 0
    path = Path(str(item.path)).relative_to(REPO_ROOT).parts
    kind = path[1] if len(path) > 2 else ""
    if kind == "e2e":
        return 1 if "ssh_hosts" in getattr(item, "fixturenames", ()) else 2
    return 3 if kind == "integration" else 4


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """The console script as a user runs it (errors printed by main), without a process:
    (exit code, stdout, stderr)."""
    from dstack_plan.cli.app import main

    monkeypatch.setattr(sys, "argv", ["dstack", *args])
    monkeypatch.setenv("NO_COLOR", "1")
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


DSTACK_EXAMPLES = REPO_ROOT / "tests" / "data" / "dstack-examples"
"""Real configurations from dstack's repository (MPL-2.0: its NOTICE.md)."""


@pytest.fixture(autouse=True, scope="session")
def _block_stray_network_access():
    real_getaddrinfo = socket.getaddrinfo
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    socket.getaddrinfo = guarded_getaddrinfo(real_getaddrinfo)
    socket.socket.connect = guarded_connect(real_connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded_connect(real_connect_ex)  # type: ignore[method-assign]
    yield
    socket.getaddrinfo = real_getaddrinfo
    socket.socket.connect = real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]


@pytest.fixture(autouse=True, scope="session")
def _keep_off_the_users_ssh_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`dstack attach` run in-process writes dev environments' SSH entries to a temp dir
    and never includes them from the real ~/.ssh/config (`runs/ssh_config.py`)."""
    name = "DSTACK_PLAN_SSH_CONFIG_DIR"
    before = os.environ.get(name)
    os.environ[name] = str(tmp_path_factory.mktemp("ssh-config"))
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


BUNDLE_CACHE_ENV = "DSTACK_PLAN_CACHE_DIR"  # dstack_plan.providers.ssh.bundle.CACHE_DIR_ENV


@pytest.fixture(autouse=True, scope="session")
def _one_agent_bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One cache of agent bundles (`providers/ssh/bundle.py`) for the session: tests give
    `dstack` a HOME of their own, and each would otherwise build the bundle into its own
    `~/.cache` (2 s of CPU). A build is reproducible (the same sources, the same bytes), so
    the cached one is the bundle the test would have built. The CLI's environment gets it
    too (`cli_env`, tests/e2e/conftest.py); a test of the cache itself sets its own."""
    before = os.environ.get(BUNDLE_CACHE_ENV)
    os.environ[BUNDLE_CACHE_ENV] = str(tmp_path_factory.mktemp("bundle-cache"))
    yield
    if before is None:
        os.environ.pop(BUNDLE_CACHE_ENV, None)
    else:
        os.environ[BUNDLE_CACHE_ENV] = before


def require(variable: str, reason: str) -> None:
    """Skip with `reason`, or fail when CI set `variable` to demand the dependency."""
    if os.environ.get(variable) == "1":
        pytest.fail(f"{reason} (and {variable}=1 demands it)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client; skips (or fails under DSTACK_PLAN_REQUIRE_DOCKER=1) without one."""
    try:
        import docker

        client = docker.from_env(timeout=20)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "no engine here"
        require("DSTACK_PLAN_REQUIRE_DOCKER", f"no Docker engine answers: {e}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory):
    """Namespace hosts running sshd (tests/infra/ssh_hosts.py); skips (or fails under
    DSTACK_PLAN_REQUIRE_SSH=1) where they cannot be made."""
    from tests.infra.ssh_hosts import SSHTestHosts, available

    reason = available()
    if reason is not None:
        require("DSTACK_PLAN_REQUIRE_SSH", reason)
    hosts = SSHTestHosts(tmp_path_factory.mktemp("ssh-hosts"))
    try:
        yield hosts.up()
    finally:
        hosts.down()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A Slurm cluster of namespace hosts (tests/infra/slurm_cluster.py): a login node with
    slurmctld and sshd, nodes cpu1, cpu2 (partition cpu) and gpu1, gpu2 (partition gpu, two
    fake GPUs each); skips (or fails under DSTACK_PLAN_REQUIRE_SLURM=1) where it cannot be
    made."""
    from tests.infra.slurm_cluster import SlurmTestCluster, available

    reason = available()
    if reason is not None:
        require("DSTACK_PLAN_REQUIRE_SLURM", reason)
    cluster = SlurmTestCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.up()
    finally:
        cluster.down()


@pytest.fixture(autouse=True)
def _no_ssh_agent_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the namespace hosts, stop every agent it left under its tmp_path: the
    hosts outlive the test, and an agent left serving one would be another agent on that
    host for the next test's fleet (refused: a host has one agent)."""
    used = "ssh_hosts" in request.fixturenames and "tmp_path" in request.fixturenames
    tmp_path = Path(request.getfixturevalue("tmp_path")) if used else None
    yield
    if tmp_path is None:
        return
    import subprocess

    for pid_file in sorted(tmp_path.glob("**/hosts/*/data/agent.pid")):
        data = str(pid_file.parent)
        subprocess.run(
            [sys.executable, "-m", "dstack_plan.agent", "stop", "--data-dir", data],
            capture_output=True,
            timeout=60,
        )


@pytest.fixture(scope="session")
def moto_process():
    """moto's S3 as a process of its own (tests/infra/moto_process.py), which a test may
    freeze (SIGSTOP) to play a hung endpoint; skips (or fails under DSTACK_PLAN_REQUIRE_S3=1)
    without moto[server] and boto3."""
    from tests.infra.moto_process import MotoProcess
    from tests.infra.moto_server import available

    reason = available()
    if reason is not None:
        require("DSTACK_PLAN_REQUIRE_S3", reason)
    server = MotoProcess()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_server():
    """moto's S3 on loopback (tests/infra/moto_server.py); skips (or fails under
    DSTACK_PLAN_REQUIRE_S3=1) without moto[server] and boto3."""
    from tests.infra.moto_server import MotoServer, available

    reason = available()
    if reason is not None:
        require("DSTACK_PLAN_REQUIRE_S3", reason)
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(moto_server):
    """A fresh bucket on the moto server, for one test."""
    return moto_server.bucket()


@pytest.fixture
def gcp():
    """A fresh fake Compute Engine API on loopback (tests/infra/fake_gcp.py), for one test."""
    from tests.infra.fake_gcp import FakeGCP
    from tests.infra.rest_server import RestServer

    app = FakeGCP()
    server = RestServer(app)
    yield app
    server.stop()


@pytest.fixture
def blank_disk(tmp_path: Path) -> Iterator[str]:
    """A blank block device (a loop device), as a freshly attached cloud disk is; skips (or
    fails under DSTACK_PLAN_REQUIRE_DOCKER=1, as the tests that mount it need Docker too)
    where loop devices cannot be made."""
    from tests.infra.loop_devices import LoopUnavailable, loop_device

    try:
        with loop_device(tmp_path / "disk.img") as device:
            yield device
    except LoopUnavailable as e:
        require("DSTACK_PLAN_REQUIRE_DOCKER", f"no loop devices here: {e}")
