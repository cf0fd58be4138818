"""The fake Kubernetes cluster's Job controller (tests/infra/fake_kube.py).

As batch/v1 documents it: pods from the template (`<job>-<5 chars>`, or for Indexed Jobs
`<job>-<index>-<5 chars>` with the completion index in a label, an annotation, the
hostname `<job>-<index>` and env JOB_COMPLETION_INDEX), up to `parallelism` at a time
until `completions` succeeded; a failed pod is replaced until `backoffLimit` failures
(restarts count for restartPolicy OnFailure), then FailureTarget and, once its pods are
gone, Failed (BackoffLimitExceeded); SuccessCriteriaMet then Complete; `suspend` deletes
the active pods gracefully and sets Suspended, resuming resets startTime;
activeDeadlineSeconds (DeadlineExceeded) and ttlSecondsAfterFinished run on timers.
Status counts are omitted when 0, as the Go type's omitempty does.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tests.infra.fake_kube_objects import (
    TERMINAL,
    condition_true,
    live,
    owned_by,
    pod_ready,
    set_condition,
)
from tests.infra.fake_kube_store import Obj, now_rfc3339

if TYPE_CHECKING:
    from tests.infra.fake_kube_controllers import Controllers


class JobController:
    """Syncs Jobs; its state is what the real controller keeps in pod finalizers."""

    def __init__(self, ctl: Controllers) -> None:
        self.ctl, self.store = ctl, ctl.store
        self._outcomes: dict[str, dict[str, str]] = {}
        """Job uid → pod uid → the terminal phase counted in the Job's status."""
        self._uncounted: set[str] = set()
        """Pods the Job controller deleted (suspension, failure, completion): not counted."""
        self._deadline_passed: set[str] = set()

    def sync(self, job: Obj) -> bool:
        """Bring one Job's pods and status where its spec says; whether anything changed."""
        meta, spec = job["metadata"], job["spec"]
        status = job.setdefault("status", {})
        if meta.get("deletionTimestamp"):
            return False
        before = copy.deepcopy(status)
        uid = meta["uid"]
        pods = [p for p in self.store.items("Pod", meta["namespace"]) if owned_by(p, uid)]
        outcomes = self._outcomes.setdefault(uid, {})
        for pod in pods:
            phase, pod_uid = pod["status"].get("phase"), pod["metadata"]["uid"]
            if phase in TERMINAL and pod_uid not in self._uncounted:
                outcomes.setdefault(pod_uid, phase)
        active = [p for p in pods if live(p)]
        terminating = [
            p
            for p in pods
            if p["metadata"].get("deletionTimestamp") and p["status"].get("phase") not in TERMINAL
        ]
        succeeded = sum(1 for o in outcomes.values() if o == "Succeeded")
        failed = sum(1 for o in outcomes.values() if o == "Failed")
        if spec["template"]["spec"].get("restartPolicy") == "OnFailure":
            failed_runs = failed + sum(_restarts(p) for p in pods)
        else:
            failed_runs = failed
        indexed = spec["completionMode"] == "Indexed"
        done_indexes = {
            _index(p) for p in pods if outcomes.get(p["metadata"]["uid"]) == "Succeeded"
        }
        conditions = status.setdefault("conditions", [])
        finished = condition_true(status, "Complete") or condition_true(status, "Failed")
        if not finished:
            target = condition_true(status, "FailureTarget")
            if target is None and failed_runs > spec["backoffLimit"]:
                target = {
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                }
            if target is None and uid in self._deadline_passed:
                target = {
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            if indexed:
                complete = len(done_indexes) >= spec["completions"]
            elif spec.get("completions") is not None:
                complete = succeeded >= spec["completions"]
            else:
                complete = succeeded > 0 and not active
            if target is not None:
                set_condition(
                    conditions, "FailureTarget", "True", target["reason"], target["message"]
                )
                self._stop_pods(active)
                if not active and not terminating:
                    set_condition(
                        conditions, "Failed", "True", target["reason"], target["message"]
                    )
                    self._finished(job)
            elif complete or condition_true(status, "SuccessCriteriaMet"):
                set_condition(
                    conditions,
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                )
                self._stop_pods(active)
                if not active and not terminating:
                    set_condition(
                        conditions,
                        "Complete",
                        "True",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                    )
                    status["completionTime"] = now_rfc3339()
                    self._finished(job)
            elif spec.get("suspend"):
                self._stop_pods(active)
                set_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended")
                active = []
            else:
                if condition_true(status, "Suspended"):
                    set_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed")
                    status["startTime"] = now_rfc3339()
                    self._deadline_passed.discard(uid)
                    self._start_deadline(job)
                elif "startTime" not in status:
                    status["startTime"] = now_rfc3339()
                    self._start_deadline(job)
                active = self._manage_job_pods(job, active, succeeded, done_indexes)
        active = [p for p in active if live(p)]
        counts = {"active": len(active), "succeeded": succeeded, "failed": failed}
        for key, value in counts.items():  # omitempty in the Go type
            if value:
                status[key] = value
            else:
                status.pop(key, None)
        status["ready"] = sum(1 for p in active if pod_ready(p))
        status["terminating"] = len(terminating)
        status["uncountedTerminatedPods"] = {}
        if indexed and done_indexes:
            status["completedIndexes"] = _ranges(sorted(done_indexes))
        if not conditions:
            status.pop("conditions")
        if status == before:
            return False
        self.store.put(job)
        return True

    def _manage_job_pods(
        self, job: Obj, active: list[Obj], succeeded: int, done: set[int]
    ) -> list[Obj]:
        spec = job["spec"]
        if len(active) > spec["parallelism"]:
            self._stop_pods(active[spec["parallelism"] :])
            return active[: spec["parallelism"]]
        room = spec["parallelism"] - len(active)
        wanted: Sequence[int | None]
        if spec["completionMode"] == "Indexed":
            busy = done | {_index(p) for p in active}
            wanted = [i for i in range(spec["completions"]) if i not in busy][:room]
        else:
            left = (spec.get("completions") or 0) - succeeded - len(active)
            if spec.get("completions") is None:
                left = 0 if succeeded else room
            wanted = [None] * max(0, min(room, left))
        for index in wanted:
            active.append(self._new_job_pod(job, index))
        return active

    def _new_job_pod(self, job: Obj, index: int | None) -> Obj:
        name = job["metadata"]["name"]
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        spec = copy.deepcopy(job["spec"]["template"]["spec"])
        generate = f"{name}-"
        if index is not None:
            key = "batch.kubernetes.io/job-completion-index"
            labels[key] = annotations[key] = str(index)
            generate = f"{name}-{index}-"
            spec["hostname"] = f"{name}-{index}"
            for container in spec["containers"]:
                container.setdefault("env", []).append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}},
                    }
                )
        return self.ctl.new_pod(job, job["spec"]["template"], spec, generate, labels, annotations)

    def _stop_pods(self, pods: list[Obj]) -> None:
        for pod in pods:
            self._uncounted.add(pod["metadata"]["uid"])
            self.ctl.delete_pod(pod, None)

    def _finished(self, job: Obj) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is not None:
            uid = job["metadata"]["uid"]
            self.ctl.after((uid, "ttl"), ttl, lambda: self.ctl.delete_by_uid(uid))

    def _start_deadline(self, job: Obj) -> None:
        deadline = job["spec"].get("activeDeadlineSeconds")
        if deadline is not None:
            uid = job["metadata"]["uid"]
            self.ctl.after((uid, "deadline"), deadline, lambda: self._deadline_passed.add(uid))


def _restarts(pod: Obj) -> int:
    return sum(cs.get("restartCount", 0) for cs in pod["status"].get("containerStatuses") or [])


def _index(pod: Obj) -> int:
    key = "batch.kubernetes.io/job-completion-index"
    return int((pod["metadata"].get("annotations") or {}).get(key, -1))


def _ranges(indexes: list[int]) -> str:
    """`0-2,4` as completedIndexes lists sorted indexes."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
