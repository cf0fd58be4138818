"""Jobs with an image: one container each, via the docker SDK (imported lazily).

Containers carry labels with the agent, job and run ids, so a restarted agent finds them again
and resumes their logs from the cursor it stored (see docker_logs).
"""

from __future__ import annotations

import io
import logging
import posixpath
import tarfile
import threading
import time
from typing import Any

from dstack_plan.agent.blobs import ABS, HOME, WD, BlobStore, UnpackError, repack
from dstack_plan.agent.disks import DiskError, disk_mount, prepare
from dstack_plan.agent.dockerlib import DockerEngine
from dstack_plan.agent.gpushare import MPS, PIPE_DIR_ENV
from dstack_plan.agent.job import Job
from dstack_plan.agent.protocol import (
    CREATING_CONTAINER_ERROR,
    EXECUTOR_ERROR,
    LABEL_AGENT_ID,
    LABEL_JOB_ID,
    LABEL_RUN_ID,
    LABEL_RUN_NAME,
    PULLING,
    RUNTIME_DOCKER,
)
from dstack_plan.agent.runtimes.base import JobControl, Runtime, StartError, host_network_ports
from dstack_plan.agent.runtimes.docker_logs import StreamCursor, skip_bytes

log = logging.getLogger(__name__)

AGENT_NOTES = "agent"
"""The output stream of the agent's own notes in a job's log (masked apart from the job's)."""

_NEVER_STARTED = "0001-01-01T00:00:00Z"
_AMD_DEVICES = ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
PUBLISH_IP = "127.0.0.1"
"""Bridged containers publish their ports on loopback only, as the agent listens: the
controller and the service proxy reach them through the host, never from the network."""


def _explain(e: Exception) -> str:
    """The engine's own message for an APIError, else the exception text."""
    explanation = getattr(e, "explanation", None)
    if explanation:
        return str(explanation.decode() if isinstance(explanation, bytes) else explanation)
    return str(e)


class DockerRuntime(Runtime):
    name = RUNTIME_DOCKER

    def __init__(
        self,
        engine: DockerEngine,
        agent_id: str,
        log_max_bytes: int,
        blobs: BlobStore | None = None,
    ):
        self._engine = engine
        self._blobs = blobs
        self._agent_id = agent_id
        # The engine keeps its own copy of the output until we remove the container. Cap it, far
        # above our own cap (a restart resumes exactly only while the engine has not rotated
        # it), and force json-file so the logs API works whatever the host's default driver.
        self._engine_log_max = max(4 * log_max_bytes, 256 * 1024 * 1024)
        self._log_config = {
            "type": "json-file",
            "config": {"max-size": str(self._engine_log_max), "max-file": "2"},
        }

    def _api(self) -> Any:
        client = self._engine.client()
        if client is None:
            raise StartError(EXECUTOR_ERROR, self._engine.error or "no docker engine")
        return client.api

    # -- starting --------------------------------------------------------------------------

    def run(self, job: Job, ctl: JobControl) -> int:
        api = self._api()
        self._ensure_image(api, job, ctl)
        if job.finished:
            return 0
        try:
            created = api.create_container(**self._container_config(api, job))
        except Exception as e:
            raise StartError(
                CREATING_CONTAINER_ERROR, f"cannot create the container: {_explain(e)}"
            ) from e
        container_id = created["Id"]
        if ctl.set_handles(job, container_id=container_id) is not None:
            return 0  # stopped before it started: cleanup() removes the container
        if job.spec.code:
            self._copy_code(api, job, container_id)
        try:
            # Attached before the start, like `docker run`: output arrives as it is written,
            # where the logs API would first wait for the engine to finish an early exit.
            sock = api.attach_socket(container_id, params={"stdout": 1, "stderr": 1, "stream": 1})
        except Exception as e:
            raise StartError(
                CREATING_CONTAINER_ERROR, f"cannot attach to the container: {_explain(e)}"
            ) from e
        try:
            api.start(container_id)
        except Exception as e:
            _close(sock)
            raise StartError(
                CREATING_CONTAINER_ERROR, f"cannot start the container: {_explain(e)}"
            ) from e
        stop = ctl.mark_started(job, ports=self._ports(api, job, container_id))
        if stop is not None:
            threading.Thread(target=self.stop, args=(job, stop.timeout), daemon=True).start()
        cursor = StreamCursor()
        # Index the start (nothing captured): an agent killed before a cursor could vouch for
        # any byte (the first chunk held back, ending in what may begin a secret) then drops
        # what it stored and captures it all again, instead of keeping it and capturing it twice.
        ctl.append_log(job, b"", cursor.encode())
        if self._copy_attached(sock, job, ctl, cursor) and not self._running(api, container_id):
            return self._exit_code(api, container_id)
        return self._follow_engine(api, job, ctl, cursor)

    def _ensure_image(self, api: Any, job: Job, ctl: JobControl) -> None:
        import docker.errors  # noqa: PLC0415

        image = job.spec.image
        try:
            api.inspect_image(image)
            return
        except docker.errors.ImageNotFound:
            pass
        except Exception as e:
            raise StartError(
                CREATING_CONTAINER_ERROR, f"cannot inspect image {image}: {_explain(e)}"
            ) from e
        ctl.set_status(job, PULLING)
        auth = job.spec.registry_auth
        credentials = None if auth is None else auth.to_dict(redact=False)
        try:
            # Errors can arrive as a failed request or inside the progress stream.
            for event in api.pull(image, stream=True, decode=True, auth_config=credentials):
                if isinstance(event, dict) and event.get("error"):
                    raise StartError(
                        CREATING_CONTAINER_ERROR, f"cannot pull image {image}: {event['error']}"
                    )
            api.inspect_image(image)
        except StartError:
            raise
        except Exception as e:
            raise StartError(
                CREATING_CONTAINER_ERROR, f"cannot pull image {image}: {_explain(e)}"
            ) from e

    def _container_config(self, api: Any, job: Job) -> dict[str, Any]:
        import docker.types  # noqa: PLC0415

        spec = job.spec
        if spec.entrypoint:
            entrypoint: list[str] | None = list(spec.entrypoint)
            command: list[str] | None = list(spec.commands)
        elif spec.commands:
            entrypoint, command = ["/bin/sh", "-c"], [" && ".join(spec.commands)]
        else:
            entrypoint, command = None, None  # the image's own ENTRYPOINT/CMD
        labels = dict(spec.labels)
        labels.update(
            {LABEL_AGENT_ID: self._agent_id, LABEL_JOB_ID: spec.id, LABEL_RUN_NAME: spec.run_name}
        )
        if spec.run_id:
            labels[LABEL_RUN_ID] = spec.run_id
        host: dict[str, Any] = {
            "network_mode": spec.network_mode,
            "init": True,  # a shell as pid 1 would ignore SIGTERM and every stop would time out
            "privileged": spec.privileged,
            "log_config": self._log_config,
        }
        if spec.shm_size:
            host["shm_size"] = spec.shm_size
        if spec.memory:
            host["mem_limit"] = spec.memory
        if spec.cpus:
            host["nano_cpus"] = int(spec.cpus * 1e9)
        mounts = [
            docker.types.Mount(v.container_path, v.host_path, type="bind", read_only=v.read_only)
            for v in spec.volumes
        ]
        mounts += self._disk_mounts(api, job)
        env = dict(spec.env)
        env.update(job.gpu_share_env)  # a shared GPU: DSTACK_GPU_SHARE, MPS limits
        if job.gpu_sharing == MPS:
            # An MPS client reaches the control daemon through its pipe directory and needs
            # the host's IPC namespace for the shared memory the server hands out.
            pipe = job.gpu_share_env[PIPE_DIR_ENV]
            mounts.append(docker.types.Mount(pipe, pipe, type="bind"))
            host["ipc_mode"] = "host"
        if mounts:
            host["mounts"] = mounts
        if job.gpus and job.gpu_vendor == "amd":
            host["devices"] = list(_AMD_DEVICES)
            env["ROCR_VISIBLE_DEVICES"] = ",".join(str(i) for i in job.gpus)
        elif job.gpus:
            host["device_requests"] = [
                docker.types.DeviceRequest(
                    driver="nvidia", device_ids=[str(i) for i in job.gpus], capabilities=[["gpu"]]
                )
            ]
        ports = None
        if spec.network_mode == "bridge" and spec.ports:
            ports = [p.container_port for p in spec.ports]
            # no host port given: Docker picks a free one, so replicas never clash
            host["port_bindings"] = {
                p.container_port: (PUBLISH_IP, p.host_port) for p in spec.ports
            }
        return {
            "image": spec.image,
            "entrypoint": entrypoint,
            "command": command,
            "environment": [f"{k}={v}" for k, v in env.items()],
            "labels": labels,
            "working_dir": spec.working_dir,
            "user": spec.user,
            "name": job.container_name,
            "ports": ports,
            "detach": True,
            "host_config": api.create_host_config(**host),
        }

    def _disk_mounts(self, api: Any, job: Job) -> list[Any]:
        """The job's network disks, found and formatted if blank (`agent/disks.py`)."""
        mounts = []
        for index, disk in enumerate(job.spec.disks):
            try:
                device, fstype = prepare(disk)
            except DiskError as e:
                raise StartError(CREATING_CONTAINER_ERROR, str(e)) from e
            name = _disk_volume(job, index)
            _remove_volume(api, name)  # one left by an earlier try may name another device
            mounts.append(disk_mount(disk, name, device, fstype))
        return mounts

    def _copy_code(self, api: Any, job: Job, container_id: str) -> None:
        """Put the code archive into the created container: `wd/` in its working dir (the
        spec's, else the image's WORKDIR, else `/`), `home/` in its user's home, `abs/` at
        `/`, owned by its user."""
        code = job.spec.code
        if self._blobs is None or code is None or not self._blobs.has(code):
            raise StartError(EXECUTOR_ERROR, f"the code archive {code} is not on this host")
        config = api.inspect_container(container_id)["Config"]
        workdir = config.get("WorkingDir") or "/"
        uid, gid, home = _container_account(api, container_id, config.get("User") or "")
        try:
            data = repack(self._blobs.path(code), {WD: workdir, HOME: home, ABS: "/"}, uid, gid)
        except UnpackError as e:
            raise StartError(CREATING_CONTAINER_ERROR, f"cannot unpack the code: {e}") from e
        try:
            api.put_archive(container_id, "/", data)
        except Exception as e:
            raise StartError(
                CREATING_CONTAINER_ERROR,
                f"cannot copy the code into the container ({workdir}): {_explain(e)}",
            ) from e

    def _ports(self, api: Any, job: Job, container_id: str) -> list[dict[str, Any]]:
        """Where each port listens on the host: the same port on the host network, else the
        port Docker published it on (read back, as Docker chose it)."""
        if job.spec.network_mode != "bridge":
            return host_network_ports(job)
        bound = api.inspect_container(container_id)["NetworkSettings"].get("Ports") or {}
        out = []
        for p in job.spec.ports:
            bindings = bound.get(f"{p.container_port}/tcp") or []
            # IPv4 first: we publish on 127.0.0.1, but an engine may list [::] bindings too
            bindings = sorted(bindings, key=lambda b: ":" in str(b.get("HostIp", "")))
            host_port = int(bindings[0]["HostPort"]) if bindings else None
            host_ip = (bindings[0].get("HostIp") or None) if bindings else None
            out.append(
                {"container_port": p.container_port, "host_port": host_port, "host_ip": host_ip}
            )
        return out

    # -- running ---------------------------------------------------------------------------

    def _copy_attached(self, sock: Any, job: Job, ctl: JobControl, cursor: StreamCursor) -> bool:
        """Copy the attached output until it ends; False if the stream broke."""
        from docker.utils.socket import STDERR, frames_iter  # noqa: PLC0415

        try:
            for stream, data in frames_iter(sock, tty=False):
                if data:
                    name = "err" if stream == STDERR else "out"
                    ctl.append_log(job, data, cursor.add(name, data), name)
            return True
        except Exception as e:
            log.warning("job %s: attached output broke off: %s", job.id, e)
            return False
        finally:
            _close(sock)

    def _running(self, api: Any, container_id: str) -> bool:
        import docker.errors  # noqa: PLC0415

        try:
            state = api.inspect_container(container_id)["State"]
        except docker.errors.NotFound as e:
            raise StartError(EXECUTOR_ERROR, "the job's container was removed while it ran") from e
        return bool(state.get("Running") or state.get("Restarting"))

    def _exit_code(self, api: Any, container_id: str) -> int:
        return int(api.wait(container_id)["StatusCode"])

    def _follow_engine(self, api: Any, job: Job, ctl: JobControl, cursor: StreamCursor) -> int:
        """Capture the rest from the engine's log (after a restart or a broken attach)."""
        container_id = job.container_id
        assert container_id is not None  # set before the container starts, or by adopt
        exact = cursor.engine_log_estimate() < self._engine_log_max
        if not exact:
            ctl.append_log(
                job,
                b"\n[dstack-plan agent] output resumed after an interruption: the engine rotated "
                b"its log, so lines around this point may be missing or repeated\n",
                cursor.encode(),
                AGENT_NOTES,
            )
        while True:
            self._pump_engine(api, job, ctl, cursor, exact)
            if not self._running(api, container_id):
                break
            time.sleep(0.2)  # the streams broke while it runs (engine restart): go again
        return self._exit_code(api, container_id)

    def _pump_engine(
        self, api: Any, job: Job, ctl: JobControl, cursor: StreamCursor, exact: bool
    ) -> None:
        """Follow stdout and stderr from the engine until the container stops."""
        lock = threading.Lock()

        def pump(name: str) -> None:
            kwargs: dict[str, Any] = {"stdout": name == "out", "stderr": name == "err"}
            if exact:
                skip = cursor.out if name == "out" else cursor.err
            else:
                skip = 0
                kwargs["since"] = max(cursor.wall - 1.0, 1.0)
            try:
                chunks = api.logs(job.container_id, stream=True, follow=True, **kwargs)
                for data in skip_bytes(chunks, skip):
                    with lock:
                        ctl.append_log(job, data, cursor.add(name, data), name)
            except Exception as e:
                log.warning("job %s: reading the engine's %s log failed: %s", job.id, name, e)

        threads = [threading.Thread(target=pump, args=(n,), daemon=True) for n in ("out", "err")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def adopt(self, job: Job, ctl: JobControl) -> int:
        import docker.errors  # noqa: PLC0415

        api = self._api()
        found = api.containers(
            all=True,
            filters={"label": [f"{LABEL_AGENT_ID}={self._agent_id}", f"{LABEL_JOB_ID}={job.id}"]},
        )
        if not found:
            if job.container_id is None:
                raise StartError(
                    EXECUTOR_ERROR, "agent restarted before the container was created"
                )
            raise StartError(
                EXECUTOR_ERROR, "the job's container disappeared while the agent was not running"
            )
        container_id = found[0]["Id"]
        try:
            details = api.inspect_container(container_id)
        except docker.errors.NotFound as e:
            raise StartError(EXECUTOR_ERROR, "the job's container disappeared") from e
        state = details["State"]
        _recover_secret_values(job, ctl, details)
        if state.get("StartedAt", _NEVER_STARTED) == _NEVER_STARTED:
            api.remove_container(container_id, force=True)
            raise StartError(EXECUTOR_ERROR, "agent restarted before the container started")
        stop = ctl.mark_started(job, container_id=container_id)
        if stop is not None:
            remaining = stop.requested_at + stop.timeout - time.time()
            threading.Thread(
                target=self.stop, args=(job, max(remaining, 0.0)), daemon=True
            ).start()
        return self._follow_engine(api, job, ctl, StreamCursor(job.logs.cursor))

    def session_target(self, job: Job) -> dict[str, Any]:
        """`docker exec` into the container: its user, env and working dir are the job's."""
        if not job.container_id:
            raise StartError(EXECUTOR_ERROR, "the job has no container")
        config = self._api().inspect_container(job.container_id)["Config"]
        return {
            "runtime": RUNTIME_DOCKER,
            "container": job.container_id,
            "working_dir": config.get("WorkingDir") or "/",
        }

    # -- stopping --------------------------------------------------------------------------

    def stop(self, job: Job, timeout: float) -> None:
        if not job.container_id:
            return
        try:
            # The engine sends SIGTERM, then SIGKILL after the timeout (whole seconds).
            self._api().stop(job.container_id, timeout=max(0, int(timeout + 0.999)))
        except Exception as e:
            log.warning("job %s: stop failed: %s", job.id, _explain(e))

    def kill(self, job: Job) -> None:
        if not job.container_id:
            return
        try:
            self._api().kill(job.container_id)
        except Exception as e:
            log.warning("job %s: kill failed: %s", job.id, _explain(e))

    def cleanup(self, job: Job) -> None:
        if not job.container_id:
            return
        try:
            self._api().remove_container(job.container_id, force=True)
        except Exception as e:
            if "No such container" not in str(e):
                log.warning("job %s: removing the container failed: %s", job.id, _explain(e))
        for index in range(len(job.spec.disks)):
            _remove_volume(self._api(), _disk_volume(job, index))


def _recover_secret_values(job: Job, ctl: JobControl, details: dict[str, Any]) -> None:
    """After a restart the agent has no secret values (its records never hold them), but the
    container's env does: the engine keeps it as long as the container exists. Read them back
    into memory so the rest of the job's output is masked as before."""
    names = job.spec.secret_env
    if not names:
        return
    env: dict[str, str] = {}
    for item in (details.get("Config") or {}).get("Env") or []:
        name, _, value = str(item).partition("=")
        env[name] = value
    job.output.set_values(env[name] for name in names if name in env)
    missing = [name for name in names if name not in env]
    if missing:
        ctl.append_log(
            job,
            f"\n[dstack-plan agent] after a restart, the values of {', '.join(missing)} could "
            f"not be read back from the container: from here on they are not masked\n".encode(),
            None,
            AGENT_NOTES,
        )


def _disk_volume(job: Job, index: int) -> str:
    """The Docker volume that mounts the job's disk `index`."""
    return f"{job.container_name}-disk{index}"


def _remove_volume(api: Any, name: str) -> None:
    try:
        api.remove_volume(name, force=True)
    except Exception as e:
        if "no such volume" not in str(e).lower():
            log.warning("removing the docker volume %s failed: %s", name, _explain(e))


def _container_account(api: Any, container_id: str, user: str) -> tuple[int, int, str]:
    """uid, gid and home of the container's `user[:group]` (names looked up in the image's
    /etc/passwd and /etc/group); root's when unset, `/` as home when the image has no entry."""
    name, _, group = user.partition(":")
    if not name or name in ("root", "0"):
        uid, gid, home = 0, 0, "/root"
    else:
        # an unknown name stays 0: docker itself refuses to start such a container
        uid, gid, home = (int(name), int(name), "/") if name.isdigit() else (0, 0, "/")
        for row in _container_rows(api, container_id, "/etc/passwd", 7):
            if row[0] == name or row[2] == name:
                uid, gid, home = int(row[2]), int(row[3]), row[5] or "/"
                break
    if group.isdigit():
        gid = int(group)
    elif group:
        for row in _container_rows(api, container_id, "/etc/group", 3):
            if row[0] == group:
                gid = int(row[2])
                break
    return uid, gid, posixpath.normpath(home)


def _container_rows(api: Any, container_id: str, path: str, fields: int) -> list[list[str]]:
    """The `:`-separated rows of a file of the container whose numeric fields parse (none
    when the image has no such file)."""
    try:
        stream, _ = api.get_archive(container_id, path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            text = handle.read().decode(errors="replace") if handle is not None else ""
    except Exception:
        return []
    rows = [line.split(":") for line in text.splitlines()]
    numeric = (2, 3) if fields >= 7 else (2,)
    return [r for r in rows if len(r) >= fields and all(r[i].isdigit() for i in numeric)]


def _close(sock: Any) -> None:
    try:
        sock.close()
    except Exception:
        pass
