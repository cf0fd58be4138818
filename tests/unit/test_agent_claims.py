"""The agent's claim store: one owning fleet per host, another project refused naming the
owner, a deliberate take-over refused while the owner's jobs run, release idempotent."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.agent.claims import ClaimStore
from dstack_plan.agent.jobs import ApiError

A = {
    "lineage": "a-lineage",
    "deployment": "aaaa0001",
    "project": "platform",
    "state": "s3://bucket/platform.json",
    "fleet": "fleet.onprem",
}
B = {**A, "lineage": "b-lineage", "deployment": "bbbb0002", "project": "ml", "state": "/b"}


def _store(tmp_path: Path, running: dict[str, list[str]] | None = None) -> ClaimStore:
    return ClaimStore(tmp_path, lambda key: (running or {}).get(key, []))


def test_first_claim_wins_and_the_next_project_is_told_whose_it_is(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.claim(A)["replaced"] is None
    with pytest.raises(ApiError) as refused:
        store.claim(B)
    assert refused.value.status == 409 and refused.value.code == "claimed"
    assert "fleet.onprem of project platform (state s3://bucket/platform.json)" in str(
        refused.value
    )
    assert refused.value.details == {"owner": {**A, "claimed_at": pytest.approx(
        store.recorded()[0]["claimed_at"])}, "jobs": []}  # fmt: skip
    # the owner claiming again (another of its fleets too) replaces its own claim
    store.claim({**A, "fleet": "fleet.renamed"})
    assert [c["fleet"] for c in _store(tmp_path).recorded()] == ["fleet.renamed"]  # on disk


def test_take_over_is_refused_while_the_owner_runs_jobs(tmp_path: Path) -> None:
    running = {"aaaa0001": ["svc", "train"]}
    store = _store(tmp_path, running)
    store.claim(A)
    with pytest.raises(ApiError) as busy:
        store.claim({**B, "take_over": True})
    assert busy.value.code == "owner_busy" and "svc, train" in str(busy.value)
    running.clear()
    taken = store.claim({**B, "take_over": True})
    assert taken["replaced"]["lineage"] == "a-lineage"
    assert [c["project"] for c in store.recorded()] == ["ml"]


def test_release_is_idempotent_and_only_the_claimant_s(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.claim(A)
    assert store.release({"lineage": "b-lineage", "fleet": "fleet.onprem"})["claims"] != []
    assert store.release({"lineage": "a-lineage", "fleet": "fleet.onprem"})["claims"] == []
    assert store.release({"lineage": "a-lineage", "fleet": "fleet.onprem"})["claims"] == []
    store.claim(B)  # free again


@pytest.mark.parametrize(
    "body",
    [None, [], {**A, "extra": 1}, {**A, "fleet": ""}, {**A, "state": 5}, {"lineage": "x"}],
)
def test_malformed_claims_are_refused_naming_the_field(tmp_path: Path, body: object) -> None:
    with pytest.raises(ApiError) as bad:
        _store(tmp_path).claim(body)
    assert bad.value.status == 400


def test_a_damaged_file_claims_nothing(tmp_path: Path) -> None:
    (tmp_path / "claims.json").write_text("{not json")
    store = _store(tmp_path)
    assert store.recorded() == []
    store.claim(A)
    assert store.recorded()[0]["project"] == "platform"
