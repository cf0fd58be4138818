"""The controller's async client for one host agent.

It talks HTTP to a base URL: the agent's own 127.0.0.1 address on the local machine; or, given
a `connect` function, over whatever stream pair that opens (a channel of an SSH connection to a
remote host). Connection failures are retried a bounded number of times (every request is
safe to repeat: a job submit carries its id, and the agent answers a repeated identical submit
with the existing job). Every failure surfaces as `AgentError(host, message, status)`.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode, urlsplit

from pydantic import SecretStr

from dstack_plan.agent.api_models import (
    ClaimAnswer,
    ClaimRelease,
    ConnectionInfo,
    Health,
    HostClaim,
    HostFacts,
    JobInfo,
    JobListing,
    JobSpec,
    JobStatus,
    LogChunk,
    ProbeListener,
    ProbeMeasure,
)
from dstack_plan.agent.http import (
    Connector,
    HttpClient,
    Response,
    StreamingResponse,
    TransportError,
    tcp,
)
from dstack_plan.agent.jobs_api import read_all_logs
from dstack_plan.agent.protocol import (
    CONNECTION_FILE,
    HEADER_LOG_FIRST_OFFSET,
    HEADER_LOG_OFFSET,
    HEALTH_TIMEOUT,
)
from dstack_plan.clock import Clock, SystemClock
from dstack_plan.errors import AgentError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
DEFAULT_RETRIES = 3
FOLLOW_IDLE_TIMEOUT = 30
UPLOAD_BYTES_PER_SECOND = 1024 * 1024
JOB_WAIT_STEP = 10
"""Seconds `wait` asks the agent to hold one answer until the job ends."""
STOP_MARGIN = 15.0
"""Seconds past a job's stop window that `drain` waits for it to end."""
KEPT_ANSWERS = 16
"""Answers a client keeps to ask again conditionally (`_current`); the oldest goes first."""

T = TypeVar("T")


def health_wait(age: float | None, start_wait: float) -> float:
    """How long a running agent `age` seconds old (None: not known) gets to answer `/health`
    before a controller about to reuse it takes it for hung and restarts it: HEALTH_TIMEOUT;
    while it may still be starting (younger than `start_wait`, the wait a fresh start gives
    it), what is left of that wait, so that an agent merely slow to start is not restarted."""
    if age is None:
        return HEALTH_TIMEOUT
    return max(HEALTH_TIMEOUT, start_wait - max(age, 0.0))


def _message(response: Response) -> str:
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    text = response.text.strip()[:500]
    return text or response.reason_phrase or f"HTTP {response.status_code}"


def _error_fields(response: Response) -> tuple[str | None, dict[str, Any] | None]:
    """The `code` and `details` of an agent's error answer (None where it has none)."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None, None
    if not isinstance(error, dict):
        return None, None
    code, details = error.get("code"), error.get("details")
    return (
        code if isinstance(code, str) else None,
        details if isinstance(details, dict) else None,
    )


def _target(path: str, params: dict[str, Any] | None) -> str:
    return f"{path}?{urlencode(params)}" if params else path


def _job_infos(response: Response) -> tuple[JobInfo, ...]:
    return JobListing.model_validate_json(response.content).jobs


def _stop_body(timeout: float | None, reason: str | None, **fields: Any) -> dict[str, Any]:
    """The body of `POST /jobs/{id}/stop`: `fields`, and `timeout` and `reason` when given."""
    optional = {"timeout": timeout, "reason": reason}
    return {**fields, **{k: v for k, v in optional.items() if v is not None}}


def _header(response: StreamingResponse, name: str, default: int) -> str | int:
    return response.headers.get(name.lower(), default)


class AgentClient:
    """Async client for the agent API at `base_url`, authenticated with `token`."""

    def __init__(
        self,
        base_url: str,
        token: str | SecretStr,
        *,
        host: str | None = None,
        connect: Connector | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        retry_delay: float = 0.2,
        clock: Clock | None = None,
    ):
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self.host = host or urlsplit(base_url).netloc or base_url
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.retry_delay = retry_delay
        self._clock = clock or SystemClock()
        self._real_clock = isinstance(self._clock, SystemClock)
        address = urlsplit(self.base_url)
        if connect is None:
            if address.scheme != "http" or not address.hostname:
                raise ValueError(f"agent URL must be http://HOST:PORT, got {base_url!r}")
            connect = tcp(address.hostname, address.port or 80)
        self._http = HttpClient(
            connect,
            host=address.netloc or self.host,
            headers={"Authorization": f"Bearer {secret}"},
            timeout=timeout,
        )
        self._kept: dict[str, tuple[str, Any]] = {}
        """GET target -> (its ETag, what its body parsed to), for `_current`."""
        self._removes_on_stop = True
        """Whether the agent takes `remove` with a stop (an older one refuses it: 400)."""

    @classmethod
    def from_data_dir(cls, data_dir: Path | str, **kwargs: Any) -> AgentClient:
        """A client for the agent running on this machine with that data dir."""
        path = Path(data_dir) / CONNECTION_FILE
        try:
            info = ConnectionInfo.model_validate_json(path.read_text())
            token = Path(info.token_file).read_text().strip()
        except (OSError, ValueError) as e:
            raise AgentError(str(data_dir), f"no running agent found ({e})") from e
        kwargs.setdefault("host", f"{info.host}:{info.port}")
        return cls(info.url, token, **kwargs)

    async def aclose(self) -> None:
        """Close the connections kept open between requests."""
        await self._http.aclose()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing --------------------------------------------------------------------------

    async def _backoff(self, attempt: int) -> None:
        await self._clock.sleep(self.retry_delay * (2**attempt))

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        content: bytes | None = None,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> Response:
        """One API call: `body` is sent as JSON, or `content` as raw bytes."""
        if body is not None:
            content = json.dumps(body).encode()
            headers = {**(headers or {}), "Content-Type": "application/json"}
        elif content is not None:
            headers = {**(headers or {}), "Content-Type": content_type}
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(
                    method,
                    _target(path, params),
                    content=content,
                    headers=headers,
                    timeout=self.timeout if timeout is None else timeout,
                )
            except TransportError as e:
                if attempt >= self.retries:
                    raise AgentError(
                        self.host,
                        f"{method} {path}: cannot reach the agent after {attempt + 1} "
                        f"attempt(s): {e}",
                    ) from e
                log.debug("%s %s: %s; retrying", method, path, e)
                await self._backoff(attempt)
                continue
            if response.status_code >= 400:
                code, details = _error_fields(response)
                raise AgentError(
                    self.host, _message(response), response.status_code, code, details
                )
            return response
        raise AssertionError("unreachable")

    async def _current(
        self, path: str, parse: Callable[[Response], T], params: dict[str, Any] | None = None
    ) -> T:
        """GET `path` and `parse` its body; when the agent answers 304 (it is the body this
        client parsed last time: `If-None-Match` with its ETag), what that parsed to. A
        watch asks every agent the same questions each tick, mostly to the same answers:
        the body is neither sent again nor parsed again. Agents that predate ETags answer
        in full every time."""
        target = _target(path, params)
        kept = self._kept.pop(target, None)
        headers = {"If-None-Match": kept[0]} if kept is not None else None
        response = await self._request("GET", path, params=params, headers=headers)
        if response.status_code == 304 and kept is not None:
            value = cast(T, kept[1])
        else:
            value = parse(response)
        tag = response.headers.get("etag")
        if tag is not None:
            self._kept[target] = (tag, value)
            if len(self._kept) > KEPT_ANSWERS:
                del self._kept[next(iter(self._kept))]
        return value

    @staticmethod
    def _job_path(job_id: str) -> str:
        return f"/jobs/{quote(job_id, safe='')}"

    # -- the API ---------------------------------------------------------------------------

    async def health(self) -> Health:
        """Version and uptime."""
        return Health.model_validate((await self._request("GET", "/health")).json())

    async def answers(self, timeout: float) -> bool:
        """Whether the agent answers `/health` within `timeout` seconds (with the client's
        retries: make it with `retries=0` for one try): False, never AgentError, when it
        does not or something else answers (see `health_wait`)."""
        try:
            response = await self._request("GET", "/health", timeout=timeout)
            return Health.model_validate(response.json()).status == "ok"
        except (AgentError, ValueError):
            return False

    async def claims(self) -> list[HostClaim]:
        """The claims on the host (its owning fleet's; none for a host nobody claims)."""
        raw = (await self._request("GET", "/claims")).json().get("claims") or []
        return [HostClaim.model_validate(c) for c in raw]

    async def claim(self, claim: HostClaim, take_over: bool = False) -> ClaimAnswer:
        """Record `claim` as the host's owner. AgentError with status 409 when another
        project owns it (`code` `claimed`, or `owner_busy` for a take-over while the owner's
        jobs run; `details`: `owner`, `jobs`)."""
        body = {**claim.model_dump(exclude={"claimed_at"}), "take_over": take_over}
        return ClaimAnswer.model_validate(
            (await self._request("PUT", "/claims", body=body)).json()
        )

    async def release_claim(self, lineage: str, fleet: str) -> ClaimRelease:
        """Forget the claim of `lineage`'s `fleet` (idempotent); the claims and unfinished
        jobs left on the host."""
        body = {"lineage": lineage, "fleet": fleet}
        response = await self._request("POST", "/claims/release", body=body)
        return ClaimRelease.model_validate(response.json())

    async def host_facts(self) -> HostFacts:
        """OS, CPUs, memory, disk, addresses, docker engine and GPUs of the host."""
        return HostFacts.model_validate((await self._request("GET", "/host")).json())

    async def metrics(self) -> str:
        """Prometheus text."""
        return (await self._request("GET", "/metrics")).text

    async def submit(self, spec: JobSpec) -> JobInfo:
        """Start a job (submitting the same spec again returns the existing job)."""
        response = await self._request("POST", "/jobs", body=spec.to_wire())
        return JobInfo.model_validate(response.json())

    async def list_jobs(
        self, status: JobStatus | str | None = None, run_name: str | None = None
    ) -> list[JobInfo]:
        """All jobs the agent knows, oldest first."""
        params = {}
        if status is not None:
            params["status"] = JobStatus(status).value
        if run_name is not None:
            params["run_name"] = run_name
        jobs = await self._current("/jobs", _job_infos, params)
        return list(jobs)

    async def get_job(self, job_id: str, wait: int = 0) -> JobInfo:
        """One job; with `wait`, the agent answers once it has finished or after `wait`
        seconds (an agent older than that answers at once)."""
        if wait <= 0:
            response = await self._request("GET", self._job_path(job_id))
        else:
            response = await self._request(
                "GET",
                self._job_path(job_id),
                params={"wait": str(wait)},
                timeout=self.timeout + wait,
            )
        return JobInfo.model_validate(response.json())

    async def stop(
        self,
        job_id: str,
        timeout: float | None = None,
        abort: bool = False,
        reason: str | None = None,
    ) -> JobInfo:
        """Stop gracefully (SIGTERM, then SIGKILL after `timeout` or the job's stop_timeout),
        or with `abort` kill at once. Returns at once; see `wait`. `reason` (one of
        `protocol.STOP_REASONS`; `terminated_by_user` when omitted) is the termination reason
        the job ends with."""
        body = _stop_body(timeout, reason, abort=abort)
        response = await self._request("POST", self._job_path(job_id) + "/stop", body=body)
        return JobInfo.model_validate(response.json())

    async def stop_and_remove(
        self,
        job_id: str,
        timeout: float | None = None,
        reason: str | None = None,
        wait: int = JOB_WAIT_STEP,
    ) -> tuple[JobInfo, bool]:
        """Stop gracefully and, once the job has ended, remove it, in one request that the
        agent holds up to `wait` seconds for the end: (how it ended, True), or (its info,
        False) when it still runs then, or the agent predates `remove` (stopped only: `wait`
        and `delete` are the caller's)."""
        if not self._removes_on_stop:
            return await self.stop(job_id, timeout=timeout, reason=reason), False
        body = _stop_body(timeout, reason, remove=True, wait=wait)
        try:
            response = await self._request(
                "POST", self._job_path(job_id) + "/stop", body=body, timeout=self.timeout + wait
            )
        except AgentError as e:
            if e.status != 400:
                raise
            self._removes_on_stop = False  # the request is valid: the agent is older
            return await self.stop(job_id, timeout=timeout, reason=reason), False
        return JobInfo.model_validate(response.json()), response.status_code == 200

    async def touch(self, job_id: str) -> JobInfo:
        """Record that someone uses the job now (its `last_activity_at`, from which watch
        counts a dev environment's `inactivity_duration`)."""
        response = await self._request("POST", self._job_path(job_id) + "/activity", body={})
        return JobInfo.model_validate(response.json())

    async def delete(self, job_id: str, force: bool = False) -> None:
        """Forget a finished job (`force` aborts a running one first)."""
        params = {"force": "1"} if force else None
        await self._request("DELETE", self._job_path(job_id), params=params, timeout=30)

    async def logs(
        self,
        job_id: str,
        offset: int = 0,
        limit: int | None = None,
        wait: int = 0,
        since: float | None = None,
    ) -> LogChunk:
        """Log bytes from `offset`; with `wait`, wait up to that many seconds for new bytes;
        with `since` (epoch seconds), from no earlier than the first byte appended since."""
        params: dict[str, Any] = {"offset": offset}
        if since is not None:
            params["since"] = repr(float(since))
        if limit is not None:
            params["limit"] = limit
        if wait:
            params["wait"] = wait
        response = await self._request(
            "GET", self._job_path(job_id) + "/logs", params=params, timeout=self.timeout + wait
        )
        data = response.json()
        data["data"] = base64.b64decode(data.get("data", ""))
        return LogChunk.model_validate(data)

    async def read_all_logs(self, job_id: str, offset: int = 0) -> bytes:
        """Everything stored from `offset` up to the log's current end."""
        return await read_all_logs(self, job_id, offset)

    async def follow_logs(
        self,
        job_id: str,
        offset: int = 0,
        idle_timeout: int = FOLLOW_IDLE_TIMEOUT,
        since: float | None = None,
    ) -> AsyncIterator[LogChunk]:
        """Stream log chunks as they come until the job ends and all its output is read;
        with `since` (epoch seconds), starting at the first byte appended since then.

        A dropped connection is resumed from the last offset received, so no byte is lost or
        repeated; only more than `retries` consecutive failures raise AgentError.
        """
        position = offset
        failures = 0
        path = self._job_path(job_id) + "/logs"
        while True:
            params = {"offset": position, "follow": "1", "idle_timeout": idle_timeout}
            if since is not None:
                params["since"] = repr(float(since))
            try:
                async with self._http.stream(
                    "GET", _target(path, params), read_timeout=idle_timeout + self.timeout
                ) as r:
                    if r.status_code >= 400:
                        raise AgentError(self.host, _message(await r.aread()), r.status_code)
                    start = int(_header(r, HEADER_LOG_OFFSET, position))
                    first = int(_header(r, HEADER_LOG_FIRST_OFFSET, 0))
                    truncated = start > position and since is None  # skipped by asking
                    since = None  # a reconnect resumes from the offset reached
                    position = start
                    async for data in r.aiter_raw():
                        if not data:
                            continue
                        yield LogChunk(
                            job_id=job_id,
                            offset=position,
                            next_offset=position + len(data),
                            first_offset=first,
                            truncated=truncated,
                            data=data,
                        )
                        truncated = False
                        position += len(data)
                        failures = 0
            except TransportError as e:
                failures += 1
                if failures > self.retries:
                    raise AgentError(self.host, f"following logs of {job_id} failed: {e}") from e
                await self._backoff(failures - 1)
                continue
            info = await self.get_job(job_id)
            if info.finished and position >= info.log_size:
                return

    async def has_blob(self, sha256: str) -> bool:
        """Whether the agent holds the uploaded blob (a code archive) `sha256`."""
        try:
            await self._request("GET", f"/blobs/{quote(sha256, safe='')}")
        except AgentError as e:
            if e.status != 404:
                raise
            if "no such endpoint" in str(e):
                raise AgentError(
                    self.host,
                    "this agent cannot receive code (it predates uploads); re-apply the "
                    "fleet to update it",
                    404,
                ) from None
            return False
        return True

    async def put_blob(self, sha256: str, data: bytes) -> None:
        """Upload `data` as blob `sha256` (the agent refuses it if the hash does not match)."""
        await self._request(
            "PUT",
            f"/blobs/{quote(sha256, safe='')}",
            content=data,
            content_type="application/gzip",
            # the body must get through whatever links the agent: allow 1 MB/s at least
            timeout=self.timeout + len(data) / UPLOAD_BYTES_PER_SECOND,
        )

    async def wait(self, job_id: str, timeout: float, poll_interval: float = 0.1) -> JobInfo:
        """Poll until the job has finished; AgentError if it has not within `timeout` s."""
        deadline = self._clock.now() + timeout
        while True:
            asked = self._clock.now()
            # the agent holds its answer until the job ends (up to `JOB_WAIT_STEP` s); one
            # that answers at once (older) is asked again every `poll_interval`
            left = max(0.0, deadline - asked)
            # (a clock of a test's making cannot shorten the agent's real wait: polled)
            hold = min(JOB_WAIT_STEP, math.ceil(left)) if self._real_clock else 0
            info = await self.get_job(job_id, wait=hold)
            if info.finished:
                return info
            if self._clock.now() >= deadline:
                raise AgentError(
                    self.host, f"job {job_id} still {info.status.value} after {timeout:g}s"
                )
            if self._clock.now() - asked < poll_interval:
                await self._clock.sleep(poll_interval)

    async def drain(self, jobs: Sequence[JobInfo]) -> None:
        """Stop `jobs` gracefully, each within its own stop window, and wait until they have
        ended (AgentError for one still running `STOP_MARGIN` seconds past its window)."""
        for job in jobs:
            await self.stop(job.id)
        for job in jobs:
            await self.wait(job.id, timeout=job.stop_timeout + STOP_MARGIN)

    # -- bandwidth probes (agent/bandwidth.py) ----------------------------------------------

    async def _probe_request(self, method: str, path: str, **kwargs: Any) -> Response:
        try:
            return await self._request(method, path, **kwargs)
        except AgentError as e:
            if e.status == 404 and "no such endpoint" in str(e):
                raise AgentError(
                    self.host,
                    "this agent cannot probe bandwidth (it predates probes); re-apply the "
                    "fleet to update it",
                    404,
                ) from None
            raise

    async def probe_listen(self, address: str | None, max_bytes: int) -> ProbeListener:
        """Open a one-shot listener for a bandwidth probe on `address` (this host's fleet
        address; every address when it is not one of the host's)."""
        body = {"address": address, "max_bytes": max_bytes}
        response = await self._probe_request("POST", "/bandwidth/listen", body=body)
        return ProbeListener.model_validate(response.json())

    async def probe_send(
        self, to: ProbeListener, address: str, seconds: float, max_bytes: int
    ) -> ProbeMeasure:
        """Send to the listener `to` (reached at `address`) for `seconds` or `max_bytes`;
        the sender's measure."""
        body = {
            "address": address,
            "port": to.port,
            "token": to.token.get_secret_value(),
            "seconds": seconds,
            "max_bytes": max_bytes,
        }
        response = await self._probe_request(
            "POST", "/bandwidth/send", body=body, timeout=self.timeout + seconds + 20
        )
        return ProbeMeasure.model_validate(response.json())

    async def probe_result(self, probe_id: str, wait: int = 10) -> ProbeMeasure:
        """The receiver's measure of probe `probe_id`, once it finished (up to `wait` s)."""
        response = await self._probe_request(
            "GET",
            f"/bandwidth/{quote(probe_id, safe='')}",
            params={"wait": wait},
            timeout=self.timeout + wait,
        )
        return ProbeMeasure.model_validate(response.json())
