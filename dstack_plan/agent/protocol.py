"""Names and limits shared by the agent and its client: statuses, reasons, labels, headers.

Standard library only: the daemon and the controller-side client both import it.
"""

from __future__ import annotations

AGENT_VERSION = "0.1.0"
API_VERSION = 1

# Job statuses, as in dstack's JobStatus (the agent never reports `provisioning`).
SUBMITTED = "submitted"
PULLING = "pulling"
RUNNING = "running"
TERMINATING = "terminating"
DONE = "done"
FAILED = "failed"
TERMINATED = "terminated"
ABORTED = "aborted"

ACTIVE_STATUSES = (SUBMITTED, PULLING, RUNNING, TERMINATING)
FINISHED_STATUSES = (DONE, FAILED, TERMINATED, ABORTED)
ALL_STATUSES = ACTIVE_STATUSES + FINISHED_STATUSES

# Termination reasons the agent can set, each with the final status it implies.
DONE_BY_RUNNER = "done_by_runner"
CONTAINER_EXITED_WITH_ERROR = "container_exited_with_error"
CREATING_CONTAINER_ERROR = "creating_container_error"
EXECUTOR_ERROR = "executor_error"
TERMINATED_BY_USER = "terminated_by_user"
MAX_DURATION_EXCEEDED = "max_duration_exceeded"
ABORTED_BY_USER = "aborted_by_user"
# Reasons a controller gives when it stops a job for its own reasons (dstack's names).
TERMINATED_BY_SERVER = "terminated_by_server"
SCALED_DOWN = "scaled_down"
INACTIVITY_DURATION_EXCEEDED = "inactivity_duration_exceeded"
TERMINATED_DUE_TO_UTILIZATION_POLICY = "terminated_due_to_utilization_policy"
PREEMPTED = "preempted"
"""Stopped to give its capacity back (a fleet's owner reclaiming GPUs another project
borrowed): an interruption of the job, which its run's retry may restart."""

STOP_REASONS = (
    TERMINATED_BY_USER,
    TERMINATED_BY_SERVER,
    SCALED_DOWN,
    INACTIVITY_DURATION_EXCEEDED,
    TERMINATED_DUE_TO_UTILIZATION_POLICY,
    MAX_DURATION_EXCEEDED,
    PREEMPTED,
)
"""The reasons `POST /jobs/{id}/stop` accepts (an abort is always `aborted_by_user`)."""

STATUS_OF_REASON = {
    DONE_BY_RUNNER: DONE,
    CONTAINER_EXITED_WITH_ERROR: FAILED,
    CREATING_CONTAINER_ERROR: FAILED,
    EXECUTOR_ERROR: FAILED,
    TERMINATED_BY_USER: TERMINATED,
    MAX_DURATION_EXCEEDED: TERMINATED,
    ABORTED_BY_USER: ABORTED,
    TERMINATED_BY_SERVER: TERMINATED,
    SCALED_DOWN: TERMINATED,
    INACTIVITY_DURATION_EXCEEDED: TERMINATED,
    TERMINATED_DUE_TO_UTILIZATION_POLICY: TERMINATED,
    PREEMPTED: TERMINATED,
}

RUNTIME_DOCKER = "docker"
RUNTIME_PROCESS = "process"

USER_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?"
"""A job's `user`: user[:group] of names or numeric ids (matched whole)."""

# Docker labels put on every container the agent creates; re-adoption after a restart uses them.
LABEL_PREFIX = "dstack-plan."
LABEL_AGENT_ID = "dstack-plan.agent-id"
LABEL_JOB_ID = "dstack-plan.job-id"
LABEL_RUN_NAME = "dstack-plan.run-name"
LABEL_RUN_ID = "dstack-plan.run-id"

# Files in the agent's data dir that a controller reads to connect.
CONNECTION_FILE = "agent.json"
TOKEN_FILE = "token"

# Headers of the streaming (follow) log response.
HEADER_LOG_OFFSET = "X-Log-Offset"
HEADER_LOG_FIRST_OFFSET = "X-Log-First-Offset"

REDACTED = "(redacted)"
"""What the agent stores and returns instead of a secret env value."""

DEFAULT_LOG_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_STOP_TIMEOUT = 10.0
HEALTH_TIMEOUT = 5.0
"""Seconds a running agent has to answer `/health` before a controller about to reuse it takes
it for hung (stopped, or listening where the controller cannot reach) and restarts it."""
HUNG_STOP_TIMEOUT = 5.0
"""Seconds such an agent gets to exit on SIGTERM before SIGKILL."""
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_BLOB_BYTES = 1024 * 1024 * 1024
"""A code archive upload (`PUT /blobs/{sha256}`) streams to disk, so it may be far larger."""
MAX_LOG_CHUNK_BYTES = 8 * 1024 * 1024
DEFAULT_LOG_CHUNK_BYTES = 1024 * 1024
