"""The HTTP JSON API on the standard library's ThreadingHTTPServer, bound to 127.0.0.1 only.

A request that does not parse, or a connection that fails mid-request, is logged as one brief
line (the peer and what was wrong: never the request line or headers, which may carry the
bearer token), at most one per `ratelimit.INTERVAL` seconds; the next says how many
were left out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from dstack_plan.agent import bandwidth
from dstack_plan.agent.app import AgentApp
from dstack_plan.agent.blobs import BlobError
from dstack_plan.agent.jobs import ApiError
from dstack_plan.agent.protocol import (
    AGENT_VERSION,
    DEFAULT_LOG_CHUNK_BYTES,
    HEADER_LOG_FIRST_OFFSET,
    HEADER_LOG_OFFSET,
    MAX_BLOB_BYTES,
    MAX_LOG_CHUNK_BYTES,
    MAX_REQUEST_BYTES,
    STOP_REASONS,
    TERMINATED_BY_USER,
)
from dstack_plan.agent.ratelimit import RateLimited
from dstack_plan.agent.spec import SpecError

log = logging.getLogger(__name__)

LISTEN_HOST = "127.0.0.1"
_DRAIN_LIMIT = 64 * 1024 * 1024
_FOLLOW_READ = 256 * 1024
"""At most one line about malformed requests or failed connections per this many seconds."""
_WORDS = re.compile(r"[A-Za-z0-9 ./-]*")
"""The plain words `send_error`'s message begins with, before it quotes the request."""

Route = tuple[str, "re.Pattern[str]", str]
_ROUTES: list[Route] = [
    ("GET", re.compile(r"/health"), "health"),
    ("GET", re.compile(r"/host"), "host"),
    ("GET", re.compile(r"/metrics"), "metrics"),
    ("POST", re.compile(r"/jobs"), "submit"),
    ("GET", re.compile(r"/jobs"), "list_jobs"),
    ("GET", re.compile(r"/jobs/(?P<job_id>[^/]+)"), "get_job"),
    ("DELETE", re.compile(r"/jobs/(?P<job_id>[^/]+)"), "delete_job"),
    ("GET", re.compile(r"/jobs/(?P<job_id>[^/]+)/logs"), "logs"),
    ("POST", re.compile(r"/jobs/(?P<job_id>[^/]+)/stop"), "stop_job"),
    ("POST", re.compile(r"/jobs/(?P<job_id>[^/]+)/activity"), "touch_job"),
    ("GET", re.compile(r"/blobs/(?P<sha256>[^/]+)"), "has_blob"),
    ("PUT", re.compile(r"/blobs/(?P<sha256>[^/]+)"), "put_blob"),
    ("POST", re.compile(r"/bandwidth/listen"), "bandwidth_listen"),
    ("POST", re.compile(r"/bandwidth/send"), "bandwidth_send"),
    ("GET", re.compile(r"/bandwidth/(?P<probe_id>[0-9a-f]+)"), "bandwidth_result"),
    ("GET", re.compile(r"/claims"), "list_claims"),
    ("PUT", re.compile(r"/claims"), "claim"),
    ("POST", re.compile(r"/claims/release"), "release_claim"),
]
_STREAMED_BODY = re.compile(r"/blobs/[^/]+")
"""PUT bodies that go to disk as they arrive (`api_put_blob`) instead of into memory."""


class AgentServer(ThreadingHTTPServer):
    """One thread per connection; handler threads never keep the process alive."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, port: int, app: AgentApp, token: str):
        self.app = app
        self.token = token
        self.probes = bandwidth.Probes()
        self.protocol_errors = RateLimited(log)
        super().__init__((LISTEN_HOST, port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """What escaped a connection's handler, as one rate-limited line instead of the
        standard library's traceback on stderr for each: a client that went away, or (with
        its traceback, as it is a bug) anything else."""
        error = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) else "a client"
        if isinstance(error, OSError):
            self.protocol_errors.warning(
                "a connection from %s failed: %s", peer, type(error).__name__
            )
        else:
            self.protocol_errors.warning(
                "a request from %s failed: %s", peer, type(error).__name__, exc_info=True
            )


MAX_JOB_WAIT = 30
"""Seconds `GET /jobs/{id}?wait=S` may hold its answer for the job to finish."""


def _query_int(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        raise ApiError(400, f"{name}: must be an integer, got {values[-1]!r}", name) from None
    if not low <= value <= high:
        raise ApiError(400, f"{name}: must be between {low} and {high}, got {value}", name)
    return value


def _query_flag(query: dict[str, list[str]], name: str) -> bool:
    value = (query.get(name) or ["0"])[-1].lower()
    if value not in ("0", "1", "true", "false", ""):
        raise ApiError(400, f"{name}: must be 0/1 or true/false, got {value!r}", name)
    return value in ("1", "true", "")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"dstack-plan-agent/{AGENT_VERSION}"
    timeout = 60  # idle keep-alive connections go away instead of holding a thread
    # Headers and body (or each log chunk) are separate small writes: with Nagle on, the
    # second waits for the client's delayed ACK, adding ~40 ms to every answer.
    disable_nagle_algorithm = True
    server: AgentServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """The access line (debug), of a request that parsed: its method and path, never the
        raw request line (a malformed one can hold the headers, the token included)."""
        if getattr(self, "command", None):
            log.debug('%s "%s %s" %s', self.address_string(), self.command, self.path, code)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """`send_error`'s line (only a request that does not parse gets one): what was wrong,
        briefly and rate-limited, without the bytes the standard library quotes."""
        if not format.startswith("code %d") or len(args) < 2:
            log.debug("%s %s", self.address_string(), format % args)  # an idle timeout
            return
        code = int(args[0])
        words = _WORDS.match(str(args[1] or ""))
        what = (words.group().strip() if words else "") or HTTPStatus(code).phrase
        self.server.protocol_errors.warning(
            "a malformed request from %s: %d %s", self.address_string(), code, what[:60]
        )

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    # -- plumbing --------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._body: bytes | None = None
        try:
            url = urlsplit(self.path)
            if method == "PUT" and _STREAMED_BODY.fullmatch(url.path):
                # The handler reads the body itself; an answer before it did leaves the
                # stream out of sync, so such a connection is never reused.
                self.close_connection = True
            else:
                # Read the body first, whatever the answer: keep-alive needs the stream in sync.
                self._read_body()
            query = parse_qs(url.query, keep_blank_values=True)
            self._check_token()
            name, params = self._route(method, url.path)
            getattr(self, "api_" + name)(query, **params)
        except SpecError as e:
            problems = [{"field": f, "message": m} for f, m in e.problems]
            self._send_json(
                400,
                {
                    "error": {
                        "code": "invalid_spec",
                        "message": str(e),
                        "field": problems[0]["field"],
                        "problems": problems,
                    }
                },
            )
        except bandwidth.ProbeError as e:
            self._send_json(
                e.status, {"error": {"code": e.code, "message": str(e), "field": e.field}}
            )
        except BlobError as e:
            self._send_json(
                e.status, {"error": {"code": e.code, "message": str(e), "field": "sha256"}}
            )
        except ApiError as e:
            extra = {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}
            error: dict[str, Any] = {"code": e.code, "message": str(e), "field": e.field}
            if e.details is not None:
                error["details"] = e.details
            self._send_json(e.status, {"error": error}, extra)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:
            log.exception("%s %s failed", method, self.path)
            self._send_json(
                500,
                {
                    "error": {
                        "code": "internal",
                        "message": f"agent error: {type(e).__name__}: {e}",
                        "field": None,
                    }
                },
            )

    def _route(self, method: str, path: str) -> tuple[str, dict[str, str]]:
        allowed = []
        for route_method, pattern, name in _ROUTES:
            match = pattern.fullmatch(path)
            if match:
                if route_method == method:
                    return name, {k: unquote(v) for k, v in match.groupdict().items()}
                allowed.append(route_method)
        if allowed:
            raise ApiError(
                405,
                f"{method} is not allowed on {path} (use {', '.join(allowed)})",
                None,
                "method_not_allowed",
            )
        raise ApiError(404, f"no such endpoint: {path}", None, "not_found")

    def _read_body(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise ApiError(411, "send the body with a Content-Length", None, "length_required")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "Content-Length is not a number") from None
        if length > MAX_REQUEST_BYTES:
            if length <= _DRAIN_LIMIT:
                self._drain(length)
            else:
                self.close_connection = True
            raise ApiError(
                413,
                f"request body is {length} bytes; the limit is {MAX_REQUEST_BYTES}",
                None,
                "too_large",
            )
        self._body = self.rfile.read(length) if length else b""

    def _drain(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1024 * 1024))
            if not chunk:
                break
            length -= len(chunk)

    def _check_token(self) -> None:
        header = self.headers.get("Authorization")
        if not header:
            raise ApiError(
                401, "missing bearer token (Authorization: Bearer <token>)", None, "unauthorized"
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.server.token.encode()
        ):
            raise ApiError(401, "invalid bearer token", None, "unauthorized")

    def _json_body(self) -> Any:
        if not self._body:
            return {}
        try:
            return json.loads(self._body)
        except ValueError as e:
            raise ApiError(400, f"malformed JSON: {e}", "body", "malformed_json") from None

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if status != 304:  # a 304's length would be that of the body it stands for
            self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)

    def _send_current(self, body: bytes, content_type: str) -> None:
        """A 200 answer with its ETag (a digest of `body`), or 304 without the body when the
        client already has it (`If-None-Match`): a watch asks every agent for its jobs, host
        facts and metrics each tick, and its jobs are mostly as they were (host facts and metrics
        carry free memory and CPU time: they change every time, and are sent as they are)."""
        tag = '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'
        if tag in self.headers.get("If-None-Match", "").replace(" ", "").split(","):
            self._send(304, b"", content_type, {"ETag": tag})
        else:
            self._send(200, body, content_type, {"ETag": tag})

    @property
    def app(self) -> AgentApp:
        return self.server.app

    # -- endpoints -------------------------------------------------------------------------

    def api_health(self, query: dict[str, list[str]]) -> None:
        self._send_json(200, self.app.health())

    def api_host(self, query: dict[str, list[str]]) -> None:
        self._send_json(200, self.app.host())

    def api_metrics(self, query: dict[str, list[str]]) -> None:
        self._send(200, self.app.metrics().encode(), self.app.metrics_content_type)

    def api_submit(self, query: dict[str, list[str]]) -> None:
        status, info = self.app.jobs.submit(self._json_body())
        self._send_json(status, info)

    def api_list_jobs(self, query: dict[str, list[str]]) -> None:
        status = _last(query, "status")
        run_name = _last(query, "run_name")
        jobs = self.app.jobs.list(status, run_name)
        self._send_current(json.dumps({"jobs": jobs}).encode(), "application/json")

    def api_get_job(self, query: dict[str, list[str]], job_id: str) -> None:
        wait = min(_query_int(query, "wait", 0, 0, 86400), MAX_JOB_WAIT)  # held at most that
        self._send_json(200, self.app.jobs.info(job_id, wait=wait))

    def api_delete_job(self, query: dict[str, list[str]], job_id: str) -> None:
        self.app.jobs.delete(job_id, force=_query_flag(query, "force"))
        self._send_json(200, {"deleted": job_id})

    def api_stop_job(self, query: dict[str, list[str]], job_id: str) -> None:
        body = self._json_body()
        fields = {"timeout", "abort", "reason", "remove", "wait"}
        if not isinstance(body, dict) or set(body) - fields:
            raise ApiError(400, "body: expected {timeout, abort, reason, remove, wait}", "body")
        timeout = body.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 <= timeout <= 3600
        ):
            raise ApiError(
                400, f"timeout: must be a number of seconds 0..3600, got {timeout!r}", "timeout"
            )
        abort = body.get("abort", False)
        if not isinstance(abort, bool):
            raise ApiError(400, "abort: must be true or false", "abort")
        reason = body.get("reason", TERMINATED_BY_USER)
        if reason not in STOP_REASONS:
            raise ApiError(
                400, f"reason: must be one of {', '.join(STOP_REASONS)}, got {reason!r}", "reason"
            )
        remove = body.get("remove", False)
        if not isinstance(remove, bool) or (remove and abort):
            raise ApiError(400, "remove: must be true or false, and not with abort", "remove")
        if not remove:
            self._send_json(202, self.app.jobs.stop(job_id, timeout, abort, reason))
            return
        # held until the job has ended (as a GET with `wait`): 200 when it is gone as well
        wait = body.get("wait", MAX_JOB_WAIT)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
            raise ApiError(400, f"wait: must be a number of seconds, got {wait!r}", "wait")
        hold = min(float(wait), float(MAX_JOB_WAIT))
        removed, info = self.app.jobs.stop_and_delete(job_id, timeout, reason, hold)
        self._send_json(200 if removed else 202, info)

    def api_touch_job(self, query: dict[str, list[str]], job_id: str) -> None:
        """Someone uses the job now (`dstack attach`, `exec`): its `last_activity_at`."""
        self._send_json(200, self.app.jobs.touch(job_id))

    def api_has_blob(self, query: dict[str, list[str]], sha256: str) -> None:
        path = self.app.blobs.path(sha256)
        if not path.is_file():
            raise ApiError(404, f"no blob {sha256}", "sha256", "no_blob")
        self._send_json(200, {"sha256": sha256, "size": path.stat().st_size})

    def api_put_blob(self, query: dict[str, list[str]], sha256: str) -> None:
        """Store the body as blob `sha256` (verified): 201 when new, 200 when it existed."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise ApiError(411, "send the body with a Content-Length", None, "length_required")
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            raise ApiError(
                411, "send the body with a Content-Length", None, "length_required"
            ) from None
        if not 0 <= length <= MAX_BLOB_BYTES:
            raise ApiError(
                413, f"blob is {length} bytes; the limit is {MAX_BLOB_BYTES}", None, "too_large"
            )
        created = self.app.blobs.put(sha256, self.rfile, length)
        self._send_json(201 if created else 200, {"sha256": sha256, "size": length})

    def api_list_claims(self, query: dict[str, list[str]]) -> None:
        self._send_json(200, {"claims": self.app.claims.recorded()})

    def api_claim(self, query: dict[str, list[str]]) -> None:
        self._send_json(200, self.app.claims.claim(self._json_body()))

    def api_release_claim(self, query: dict[str, list[str]]) -> None:
        released = self.app.claims.release(self._json_body())
        self._send_json(200, {**released, "unfinished_jobs": self.app.unfinished_jobs()})

    def api_bandwidth_listen(self, query: dict[str, list[str]]) -> None:
        """Open a one-shot probe listener on this host's fleet address (`bandwidth.py`)."""
        self._send_json(201, self.server.probes.listen(self._json_body()))

    def api_bandwidth_send(self, query: dict[str, list[str]]) -> None:
        """Send to another host's probe listener for about a second; answers the rate."""
        self._send_json(200, bandwidth.send(self._json_body()))

    def api_bandwidth_result(self, query: dict[str, list[str]], probe_id: str) -> None:
        wait = _query_int(query, "wait", 0, 0, bandwidth.RESULT_WAIT_MAX)
        self._send_json(200, self.server.probes.result(probe_id, wait))

    def api_logs(self, query: dict[str, list[str]], job_id: str) -> None:
        job = self.app.jobs.get(job_id)
        offset = _query_int(query, "offset", 0, 0, 2**62)
        since = _last(query, "since")
        if since is not None:  # epoch seconds: start at the first byte appended since then
            try:
                moment = float(since)
            except ValueError:
                moment = math.nan
            if not math.isfinite(moment):
                raise ApiError(400, f"since: must be epoch seconds, got {since!r}", "since")
            offset = max(offset, job.logs.offset_at(moment))
        if _query_flag(query, "follow"):
            idle = _query_int(query, "idle_timeout", 30, 1, 300)
            self._follow_logs(job, offset, idle)
            return
        limit = _query_int(query, "limit", DEFAULT_LOG_CHUNK_BYTES, 1, MAX_LOG_CHUNK_BYTES)
        wait = _query_int(query, "wait", 0, 0, 60)
        if wait:
            job.logs.wait(offset, wait)
        finished = job.finished  # sampled before reading, so `complete` cannot skip a tail
        start, data, times = job.logs.read_timed(offset, limit)
        next_offset = start + len(data)
        self._send_json(
            200,
            {
                "job_id": job_id,
                "offset": start,
                "next_offset": next_offset,
                "first_offset": job.logs.first_offset,
                "size": job.logs.end,
                "truncated": offset < start,
                "complete": finished and next_offset >= job.logs.end,
                "times": times,  # [[offset, epoch], ...]: when the bytes were appended
                "data": base64.b64encode(data).decode(),
            },
        )

    def _follow_logs(self, job: Any, offset: int, idle_timeout: int) -> None:
        """Chunked stream from `offset` until the job ends and its log is fully sent."""
        logs = job.logs
        start = max(offset, logs.first_offset)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header(HEADER_LOG_OFFSET, str(start))
        self.send_header(HEADER_LOG_FIRST_OFFSET, str(logs.first_offset))
        self.end_headers()
        position = start
        idle_until = time.monotonic() + idle_timeout
        write: Callable[[bytes], Any] = self.wfile.write
        while True:
            finished = job.finished
            actual, data = logs.read(position, _FOLLOW_READ)
            if actual > position:
                break  # rotation overtook this reader: end, so it reconnects and sees the gap
            if data:
                write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                position += len(data)
                idle_until = time.monotonic() + idle_timeout
                continue
            if finished and position >= logs.end:
                break
            if position < logs.end:
                break  # bytes exist but cannot be read: the job was deleted under us
            remaining = idle_until - time.monotonic()
            if remaining <= 0:
                break  # the client reconnects from its offset; no silent half-dead streams
            logs.wait(position, min(remaining, 1.0))
        write(b"0\r\n\r\n")
        self.wfile.flush()


def _last(query: dict[str, list[str]], name: str) -> str | None:
    """The last value given for a query parameter, as `?a=1&a=2` means 2."""
    values = query.get(name)
    return values[-1] if values else None
