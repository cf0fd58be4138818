"""Who owns this host: the claim of the one fleet that enrolled it, kept in the data dir.

A host has one owning fleet. When a fleet enrolls the host, the controller records a claim
(the owner's state lineage and deployment key, the project's name, where its state lives,
the fleet's address); removing the host from the fleet, or destroying the fleet, releases it.
Another project's claim is refused, naming the owner, unless it takes over deliberately, which
is refused too while the owner's jobs run here. The agent arbitrates: two controllers
claiming at once are answered one after the other, under one lock, from one file.

Standard library only: the agent runs on hosts with nothing but python3.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dstack_plan.agent.datadir import read_json, write_json_atomic
from dstack_plan.agent.jobs import ApiError

CLAIMS_FILE = "claims.json"
FIELDS = ("lineage", "deployment", "project", "state", "fleet")
"""What a claim names; all strings. `claimed_at` (epoch seconds) is added here."""


def check_claim(body: Any) -> dict[str, str]:
    """The claim `body` holds, checked; ApiError(400) naming the bad field otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "body: expected a claim object", "body")
    unknown = sorted(set(body) - set(FIELDS) - {"take_over"})
    if unknown:
        raise ApiError(400, f"{unknown[0]}: unknown field", unknown[0])
    claim = {}
    for name in FIELDS:
        value = body.get(name)
        if not isinstance(value, str) or not value or len(value) > 2048:
            raise ApiError(400, f"{name}: expected a non-empty string", name)
        claim[name] = value
    return claim


class ClaimStore:
    """The host's claims (at most one: its owning fleet's), in `<data dir>/claims.json`."""

    def __init__(self, root: Path, running_jobs_of: Callable[[str], list[str]]):
        self._path = Path(root) / CLAIMS_FILE
        self._lock = threading.Lock()
        self._running_jobs_of = running_jobs_of
        """deployment key -> the run names of its jobs that have not finished here."""

    def recorded(self) -> list[dict[str, Any]]:
        """The claims recorded (an empty list when none)."""
        with self._lock:
            return self._read()

    def claim(self, body: Any) -> dict[str, Any]:
        """Record the claim `body` holds, as the host's owner.

        The same project claiming again (its fleet, or another fleet of the same state: a
        fleet renamed or replaced) replaces its claim. Another project's claim is refused
        (409, code `claimed`, the owner's claim and running jobs in `owner` / `jobs`) unless
        `take_over` is true and no job of the owner runs here (409, code `owner_busy`)."""
        claim = check_claim(body)
        take_over = body.get("take_over") is True
        with self._lock:
            claims = self._read()
            others = [c for c in claims if c.get("lineage") != claim["lineage"]]
            replaced = None
            if others:
                owner = others[0]
                jobs = self._running_jobs_of(str(owner.get("deployment", "")))
                if not take_over:
                    raise _refused("claimed", owner, jobs)
                if jobs:
                    raise _refused("owner_busy", owner, jobs)
                replaced = owner
            record = {**claim, "claimed_at": time.time()}
            write_json_atomic(self._path, [record])
        return {"claim": record, "replaced": replaced}

    def release(self, body: Any) -> dict[str, Any]:
        """Forget the claim of `body`'s lineage on `body`'s fleet (nothing when it holds none:
        releasing is idempotent); the claims left, and the jobs that have not finished."""
        if not isinstance(body, dict) or not all(
            isinstance(body.get(k), str) for k in ("lineage", "fleet")
        ):
            raise ApiError(400, "body: expected {lineage, fleet}", "body")
        with self._lock:
            claims = self._read()
            left = [
                c
                for c in claims
                if (c.get("lineage"), c.get("fleet")) != (body["lineage"], body["fleet"])
            ]
            if len(left) != len(claims):
                write_json_atomic(self._path, left)
        return {"claims": left}

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = read_json(self._path)
        except FileNotFoundError:
            return []
        except (OSError, ValueError):  # a damaged file claims nothing; the next claim heals it
            return []
        return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


def _refused(code: str, owner: dict[str, Any], jobs: list[str]) -> ApiError:
    who = f"{owner.get('fleet')} of project {owner.get('project')} (state {owner.get('state')})"
    if code == "owner_busy":
        message = f"the host belongs to {who}, whose jobs run there: {', '.join(jobs)}"
    else:
        message = f"the host belongs to {who}"
    return ApiError(409, message, None, code, {"owner": owner, "jobs": jobs})
