"""The agent behind the HTTP layer: wires data dir, docker, GPUs and jobs; answers host queries."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dstack_plan.agent import gpus as gpu_tools
from dstack_plan.agent.blobs import BlobStore
from dstack_plan.agent.claims import ClaimStore
from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.dockerlib import DockerEngine
from dstack_plan.agent.gpualloc import GpuAllocator
from dstack_plan.agent.hostfacts import host_facts
from dstack_plan.agent.jobs import JobManager
from dstack_plan.agent.metrics import CONTENT_TYPE, host_families, render
from dstack_plan.agent.protocol import AGENT_VERSION, API_VERSION, FINISHED_STATUSES

log = logging.getLogger(__name__)

GPU_REFRESH_SECONDS = 30.0


class AgentApp:
    """Everything the API serves, independent of HTTP."""

    def __init__(self, data: DataDir, log_max_bytes: int):
        self.data = data
        self.started_at = time.time()
        self.agent_id = data.agent_id()
        self.engine = DockerEngine()
        self.blobs = BlobStore(data.blobs)
        self._gpu_lock = threading.Lock()
        self._gpus: list[dict[str, Any]] = gpu_tools.detect_gpus()
        self._gpus_at = time.monotonic()
        self.allocator = GpuAllocator(
            (g["index"] for g in self._gpus), {g["index"]: g["memory_mib"] for g in self._gpus}
        )
        self.jobs = JobManager(
            data,
            self.agent_id,
            self.engine,
            self.allocator,
            self._gpus[0]["vendor"] if self._gpus else None,
            log_max_bytes,
            self.blobs,
        )
        self.claims = ClaimStore(data.root, self.running_runs_of)
        log.info("agent %s: %d GPU(s) found", self.agent_id, len(self._gpus))

    def unfinished_jobs(self, deployment: str | None = None) -> list[dict[str, Any]]:
        """The jobs that have not finished (of the state whose deployment key is given)."""
        return [
            job
            for job in self.jobs.list()
            if job["status"] not in FINISHED_STATUSES
            and (deployment is None or _deployment(job) == deployment)
        ]

    def running_runs_of(self, deployment: str) -> list[str]:
        """The names of the runs of `deployment` with a job that has not finished here."""
        return sorted({str(j.get("run_name")) for j in self.unfinished_jobs(deployment)})

    def start(self) -> None:
        """Recover jobs from a previous run. Docker is not connected here: the SDK is imported
        by the first request that needs it (`dockerlib`), so a fresh agent answers sooner and
        a host that runs no containers never pays for it."""
        self.jobs.recover()

    def gpus(self) -> list[dict[str, Any]]:
        """Detected GPUs, re-detected at most every GPU_REFRESH_SECONDS."""
        with self._gpu_lock:
            if time.monotonic() - self._gpus_at > GPU_REFRESH_SECONDS:
                self._gpus = gpu_tools.detect_gpus()
                self._gpus_at = time.monotonic()
                self.allocator.set_inventory(
                    (g["index"] for g in self._gpus),
                    {g["index"]: g["memory_mib"] for g in self._gpus},
                )
                if self._gpus:
                    self.jobs.gpu_vendor = self._gpus[0]["vendor"]
            return list(self._gpus)

    def health(self) -> dict[str, Any]:
        """Liveness: version and uptime."""
        return {
            "status": "ok",
            "version": AGENT_VERSION,
            "api_version": API_VERSION,
            "agent_id": self.agent_id,
            "uptime_seconds": round(time.time() - self.started_at, 3),
        }

    def host(self) -> dict[str, Any]:
        """Host facts, docker engine, GPUs and which job holds each."""
        facts = host_facts(self.data.root)
        facts["docker"] = self.engine.facts()
        facts["gpus"] = self.gpus()
        snapshot = self.allocator.snapshot()
        facts["gpus_allocated"] = snapshot["allocated"]
        facts["gpu_shares"] = snapshot["shares"]
        return facts

    def metrics(self) -> str:
        """Prometheus text."""
        gpus = self.gpus()
        usage: list[dict[str, Any]] | None = None
        if any(g["vendor"] == "nvidia" for g in gpus):
            usage = gpu_tools.gpu_usage()
        families = host_families(
            time.time() - self.started_at,
            self.jobs.counts(),
            usage or [],
            self.allocator.allocations(),
            [g["index"] for g in gpus],
        )
        return render(families)

    metrics_content_type = CONTENT_TYPE


def _deployment(job: dict[str, Any]) -> str | None:
    """The deployment key of the state that submitted `job` (its `deployment` label)."""
    spec = job.get("spec")
    labels = spec.get("labels") if isinstance(spec, dict) else None
    key = labels.get("deployment") if isinstance(labels, dict) else None
    return key if isinstance(key, str) else None
