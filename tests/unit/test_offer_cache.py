"""The offer cache: answers kept per key for the TTL, then asked again; never in the way."""

from __future__ import annotations

import stat
from pathlib import Path

from dstack_plan.providers.offer_cache import OfferCache


def test_an_answer_is_kept_for_the_ttl_and_private(tmp_path: Path) -> None:
    cache = OfferCache.of(tmp_path, "aws")
    cache.ttl = 60
    assert cache.get("offerings:us-east-1") is None
    cache.put("offerings:us-east-1", ["m5.large", "g5.xlarge"], now=1000.0)
    assert OfferCache.of(tmp_path, "aws").get("offerings:us-east-1", now=1059.0) is not None
    assert cache.get("offerings:us-east-1", now=1059.0) == ["g5.xlarge", "m5.large"]
    assert cache.get("offerings:us-east-1", now=1061.0) is None  # stale: ask again
    assert cache.get("offerings:eu-west-1", now=1001.0) is None
    assert cache.path is not None and stat.S_IMODE(cache.path.stat().st_mode) == 0o600


def test_a_ttl_of_zero_turns_it_off_and_a_broken_file_is_empty(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DSTACK_PLAN_OFFER_CACHE_TTL", "0")
    off = OfferCache.of(tmp_path, "aws")
    off.put("k", ["a"])
    assert off.get("k") is None and off.path is not None and not off.path.exists()
    monkeypatch.delenv("DSTACK_PLAN_OFFER_CACHE_TTL")
    cache = OfferCache.of(tmp_path, "aws")
    assert cache.path is not None
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text("{not json")
    assert cache.get("k") is None
    cache.put("k", ["a"])  # replaces the broken file
    assert cache.get("k") == ["a"]
    assert OfferCache(None).get("k") is None  # no project: nothing kept
