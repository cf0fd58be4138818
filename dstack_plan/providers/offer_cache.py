"""What a provider asked its cloud about offers, kept on disk for a while: `.dstack/cache/`.

Which instance types a region offers changes rarely, but asking costs a round trip per region
(and loading the SDK): a plan with cloud fleets would pay it every time. A provider keeps the
answers here, one JSON file per provider, each answer with when it was fetched; an answer older
than the TTL (24 h by default, `DSTACK_PLAN_OFFER_CACHE_TTL` seconds; 0 turns the cache off) is
asked again. Prices are not cached: they come from the shipped catalogue. A file that cannot be
read is as good as empty; one that cannot be written only costs the next command a round trip.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from dstack_plan.config.atomic import write_private_atomic

CACHE_DIR = ".dstack/cache"
TTL_ENV = "DSTACK_PLAN_OFFER_CACHE_TTL"
DEFAULT_TTL_S = 24 * 3600.0


class OfferCache:
    """Answers of one provider by key (`offerings:us-east-1`), each valid for `ttl` seconds."""

    def __init__(self, path: Path | None, ttl: float | None = None):
        self.path = path
        """The provider's file; None: nothing is kept (a provider built without a project)."""
        self.ttl = _ttl() if ttl is None else ttl

    @classmethod
    def of(cls, project_dir: str | Path, provider: str) -> OfferCache:
        return cls(Path(project_dir) / CACHE_DIR / f"{provider}-offers.json")

    def get(self, key: str, now: float | None = None) -> list[str] | None:
        """The answer kept for `key` if younger than the TTL, else None."""
        entry = self._read().get(key)
        if not isinstance(entry, dict) or self.ttl <= 0:
            return None
        fetched, values = entry.get("fetched_at"), entry.get("values")
        if not isinstance(fetched, int | float) or not isinstance(values, list):
            return None
        if (time.time() if now is None else now) - fetched > self.ttl:
            return None
        return [str(v) for v in values]

    def put(self, key: str, values: list[str], now: float | None = None) -> None:
        if self.path is None or self.ttl <= 0:
            return
        data = self._read()
        data[key] = {"fetched_at": time.time() if now is None else now, "values": sorted(values)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private_atomic(self.path, json.dumps(data).encode(), sync_dir=False)
        except OSError:
            pass  # only a round trip lost

    def _read(self) -> dict[str, object]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


def _ttl() -> float:
    raw = os.environ.get(TTL_ENV)
    try:
        return float(raw) if raw else DEFAULT_TTL_S
    except ValueError:
        return DEFAULT_TTL_S
