"""The fake Kubernetes cluster's kubelet (tests/infra/fake_kube.py): pods as local processes.

A pod placed on a Ready node runs its one container as a process group on this machine
(`start_new_session=True`): argv is the container's `command` + `args` with `$(VAR)`
references expanded as Kubernetes does; the image is recorded in the status but never
pulled or used, so the command must exist here. cwd is `workingDir` when that directory
exists here, else a directory of the pod's own. The environment is PATH, HOME and LANG of
the test process, then the container's `envFrom` (secrets, config maps), then its `env`
(values, secretKeyRef, configMapKeyRef, fieldRef), then HOSTNAME. stdout and stderr go to
one log file per container run, with each line's arrival time kept for `sinceSeconds`,
`tailLines` and `timestamps`.

Each process has a reader thread (the log) and a waiter thread: the waiter notices the exit
(no polling), kills what is left of the group (a real container's processes die with it),
and records the outcome: `Succeeded`/`Failed` with the exit code, or for restartPolicy
Always (and OnFailure after a failure) a restart in place after a short back-off
(restartCount + 1, lastState.terminated). A graceful stop is SIGTERM to the container's
main process (as a runtime signals only a container's PID 1), then SIGKILL to the whole group
after the grace period (a timer thread).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.infra.fake_kube_env import POD_IP, ConfigError, environment
from tests.infra.fake_kube_logs import LogRun, read_log, render_log
from tests.infra.fake_kube_objects import set_condition
from tests.infra.fake_kube_store import Obj, Store, bad_request, now_rfc3339


@dataclass
class Container:
    """What the kubelet knows of one pod's container."""

    namespace: str
    pod: str
    uid: str
    proc: subprocess.Popen[bytes] | None = None
    runs: list[LogRun] = field(default_factory=list)
    started_at: str = ""
    kill_timer: threading.Timer | None = None
    restart_timer: threading.Timer | None = None
    waiter: threading.Thread | None = None
    lost: bool = False
    """The node was lost: the exit that follows is not the pod's outcome."""
    blocked: str = ""
    """Why it could not start yet (CreateContainerConfigError), retried on each sync."""


class Kubelet:
    """Runs the pods the scheduler placed. Every method is called with `lock` held;
    `on_change` (the controllers' settle) is called, under it, after a process exits."""

    def __init__(
        self, store: Store, lock: threading.RLock, workdir: Path, on_change: Callable[[], None]
    ) -> None:
        self.store, self.lock, self.workdir, self.on_change = store, lock, workdir, on_change
        self.containers: dict[str, Container] = {}
        self.envs: dict[tuple[str, str], dict[str, str]] = {}
        """(namespace, pod) → the environment its process last got (kept after it ends)."""
        self.logs: dict[tuple[str, str], list[LogRun]] = {}
        """(namespace, pod) → its container's runs' logs (kept after the pod is gone)."""
        self.stopping = False

    # -- the kubelet's loop, run by the controllers' settle

    def sync(self) -> bool:
        """Start the pods placed on nodes that have not started, and retry those blocked on
        their configuration; whether any pod changed."""
        changed = False
        for pod in self.store.items("Pod"):
            meta = pod["metadata"]
            if not pod["spec"].get("nodeName") or meta.get("deletionTimestamp"):
                continue
            c = self.containers.get(meta["uid"])
            if c is None and pod["status"].get("phase") == "Pending":
                c = Container(meta["namespace"], meta["name"], meta["uid"])
                self.containers[c.uid] = c
                self.logs[(c.namespace, c.pod)] = c.runs
                changed |= self._start(pod, c)
            elif c is not None and c.blocked and c.proc is None:
                changed |= self._start(pod, c)
        return changed

    def active(self, uid: str) -> bool:
        """Whether the pod's process runs (or is about to be restarted)."""
        c = self.containers.get(uid)
        return c is not None and (c.proc is not None or c.restart_timer is not None)

    def forget(self, uid: str) -> None:
        """The pod is gone from the API."""
        c = self.containers.pop(uid, None)
        if c is not None and c.restart_timer is not None:
            c.restart_timer.cancel()

    def terminate(self, pod: Obj, grace: int) -> None:
        """Stop the pod's process: SIGTERM to its main process now (a runtime signals the
        container's PID 1 only; the rest of the group dies with it), SIGKILL to the group
        after `grace` seconds, or at once when `grace` is 0; a pending restart is
        cancelled."""
        c = self.containers.get(pod["metadata"]["uid"])
        if c is None:
            return
        if c.restart_timer is not None:
            c.restart_timer.cancel()
            c.restart_timer = None
        if c.proc is None:
            return
        if grace <= 0:
            _signal_group(c.proc, signal.SIGKILL)
            return
        if c.kill_timer is not None:
            return  # terminating already: the first grace period stands
        try:
            c.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass  # exited already: its waiter reports it
        c.kill_timer = threading.Timer(grace, _signal_group, (c.proc, signal.SIGKILL))
        c.kill_timer.daemon = True
        c.kill_timer.start()

    def node_lost(self, node: str) -> bool:
        """The node stopped being Ready: its pods' processes are killed (SIGKILL) and the
        pods fail with reason `NodeLost`, their container terminated with exit code 137."""
        changed = False
        for pod in self.store.items("Pod"):
            status = pod["status"]
            if pod["spec"].get("nodeName") != node or status.get("phase") not in (
                "Pending",
                "Running",
            ):
                continue
            c = self.containers.get(pod["metadata"]["uid"])
            if c is not None:
                c.lost = True
                if c.restart_timer is not None:
                    c.restart_timer.cancel()
                    c.restart_timer = None
                if c.proc is not None:
                    _signal_group(c.proc, signal.SIGKILL)
            terminated = {"exitCode": 137, "reason": "Error", "message": "node lost"}
            if c is not None and c.started_at:
                terminated["startedAt"] = c.started_at
            terminated["finishedAt"] = now_rfc3339()
            status.update(
                phase="Failed",
                reason="NodeLost",
                message=f"Node {node} which was running pod {pod['metadata']['name']} is "
                "unresponsive",
            )
            for cs in status.get("containerStatuses") or []:
                cs.update(state={"terminated": terminated}, ready=False, started=False)
            _set_ready(status, False, "PodFailed")
            self.store.put(pod)
            changed = True
        return changed

    def stop(self) -> list[threading.Thread]:
        """Kill every process group and cancel every timer; the waiter threads to join
        (after releasing the lock: they take it to finish)."""
        self.stopping = True
        waiters = []
        for c in self.containers.values():
            for timer in (c.kill_timer, c.restart_timer):
                if timer is not None:
                    timer.cancel()
            if c.proc is not None:
                _signal_group(c.proc, signal.SIGKILL)
            if c.waiter is not None:
                waiters.append(c.waiter)
        return waiters

    # -- logs

    def log(self, pod: Obj, query: dict[str, list[str]]) -> bytes:
        """The container's log as `GET .../pods/{name}/log` answers it (query `container`,
        `previous`, `limitBytes`, `sinceSeconds`, `tailLines`, `timestamps`; `follow` is not
        streamed: it answers what is there)."""

        def arg(name: str) -> str | None:
            return query.get(name, [None])[0]

        name, spec = pod["metadata"]["name"], pod["spec"]
        container = arg("container") or spec["containers"][0]["name"]
        if container != spec["containers"][0]["name"]:
            raise bad_request(f"container {container} is not valid for pod {name}")
        c = self.containers.get(pod["metadata"]["uid"])
        runs = c.runs if c is not None else []
        if arg("previous") == "true":
            if len(runs) < 2:
                raise bad_request(
                    f'previous terminated container "{container}" in pod "{name}" not found'
                )
            run = runs[-2]
        elif runs:
            run = runs[-1]
        else:
            statuses = pod["status"].get("containerStatuses") or [{}]
            waiting = statuses[0].get("state", {}).get("waiting", {})
            reason = waiting.get("reason", "ContainerCreating")
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        return render_log(run, arg)

    # -- running

    def _start(self, pod: Obj, c: Container) -> bool:
        container = pod["spec"]["containers"][0]
        status = pod["status"]
        # a restart keeps the count and the last termination
        previous = (status.get("containerStatuses") or [{}])[0]
        try:
            env, argv = environment(self.store, pod, container)
        except ConfigError as e:
            reason = "CreateContainerConfigError"
            if str(e) == c.blocked:
                return False
            c.blocked = str(e)
            waiting = {"waiting": {"reason": reason, "message": str(e)}}
            status["containerStatuses"] = [_container_status(container, c, waiting, previous)]
            self.store.put(pod)
            return True
        c.blocked = ""
        self.envs[(c.namespace, c.pod)] = env
        workdir = container.get("workingDir")
        cwd = Path(workdir) if workdir and Path(workdir).is_dir() else self._pod_dir(c)
        run = LogRun(self._pod_dir(c) / f"{container['name']}.{len(c.runs)}.log")
        run.path.touch()
        c.runs.append(run)
        c.started_at = now_rfc3339()
        status.setdefault("startTime", c.started_at)
        status.update(phase="Running", hostIP=POD_IP, hostIPs=[{"ip": POD_IP}], podIP=POD_IP)
        status["podIPs"] = [{"ip": POD_IP}]
        try:
            c.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:  # as a runtime's StartError: exec failed, exit code 128
            run.path.write_text(f"{e}\n")
            run.line_starts.append((0, time.time()))
            self._finished(pod, c, 128, "StartError", str(e))
            return True
        state = {"running": {"startedAt": c.started_at}}
        status["containerStatuses"] = [_container_status(container, c, state, previous)]
        for kind in ("PodReadyToStartContainers", "Initialized"):
            set_condition(status.setdefault("conditions", []), kind, "True")
        _set_ready(status, True)
        reader = threading.Thread(target=read_log, args=(c.proc, run), daemon=True)
        reader.start()
        c.waiter = threading.Thread(target=self._wait, args=(c, c.proc, reader), daemon=True)
        c.waiter.start()
        self.store.put(pod)
        return True

    def _pod_dir(self, c: Container) -> Path:
        directory = self.workdir / f"{c.namespace}_{c.pod}_{c.uid[:8]}"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _wait(self, c: Container, proc: subprocess.Popen[bytes], reader: threading.Thread) -> None:
        code = proc.wait()
        # the container is gone: so is every process it left in its group
        _signal_group(proc, signal.SIGKILL)
        reader.join(timeout=30)
        with self.lock:
            if c.kill_timer is not None:
                c.kill_timer.cancel()
                c.kill_timer = None
            if c.proc is not proc or self.stopping:
                return
            c.proc = None
            pod = self.store.get("Pod", c.namespace, c.pod)
            if pod is None or pod["metadata"]["uid"] != c.uid or c.lost:
                self.on_change()
                return
            self._finished(pod, c, 128 - code if code < 0 else code)
            self.on_change()

    def _finished(
        self, pod: Obj, c: Container, code: int, reason: str = "", message: str = ""
    ) -> None:
        status, spec = pod["status"], pod["spec"]
        container = spec["containers"][0]
        terminated: Obj = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": c.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": _container_id(c),
        }
        if message:
            terminated["message"] = message
        policy = spec.get("restartPolicy", "Always")
        deleting = pod["metadata"].get("deletionTimestamp")
        previous = (status.get("containerStatuses") or [{}])[0]
        restarts = previous.get("restartCount", 0)
        if not deleting and (policy == "Always" or (policy == "OnFailure" and code != 0)):
            # a short back-off (the kubelet's starts at 10 s): enough not to spin on a
            # command that fails at once
            delay = min(0.05 * 2**restarts, 1.0)
            waiting = {"reason": "CrashLoopBackOff", "message": f"back-off {delay}s restarting"}
            cs = _container_status(container, c, {"waiting": waiting}, previous)
            cs.update(restartCount=restarts + 1, lastState={"terminated": terminated})
            status["containerStatuses"] = [cs]
            _set_ready(status, False, "ContainersNotReady")
            c.restart_timer = threading.Timer(delay, self._restart, (c,))
            c.restart_timer.daemon = True
            c.restart_timer.start()
        else:
            cs = _container_status(container, c, {"terminated": terminated}, previous)
            status["containerStatuses"] = [cs]
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            _set_ready(status, False, "PodCompleted")
        self.store.put(pod)

    def _restart(self, c: Container) -> None:
        with self.lock:
            if self.stopping or c.restart_timer is None:
                return
            c.restart_timer = None
            pod = self.store.get("Pod", c.namespace, c.pod)
            if (
                pod is None
                or pod["metadata"]["uid"] != c.uid
                or pod["metadata"].get("deletionTimestamp")
            ):
                return
            self._start(pod, c)
            self.on_change()


def _container_id(c: Container) -> str:
    return f"fake://{c.uid[:8]}-{len(c.runs)}"


def _container_status(container: Obj, c: Container, state: Obj, previous: Obj) -> Obj:
    """A containerStatuses item in `state`, keeping restartCount and lastState of the
    `previous` one."""
    running = "running" in state
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": f"fake://{container.get('image', '')}" if c.runs else "",
        "containerID": _container_id(c),
        "ready": running,
        "started": running,
        "restartCount": previous.get("restartCount", 0),
        "state": state,
        "lastState": previous.get("lastState", {}),
    }


def _set_ready(status: Obj, ready: bool, reason: str = "") -> None:
    conditions = status.setdefault("conditions", [])
    for kind in ("ContainersReady", "Ready"):
        set_condition(conditions, kind, "True" if ready else "False", "" if ready else reason)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
