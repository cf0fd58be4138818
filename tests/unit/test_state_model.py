"""The state model and its file format: addresses, hashes, canonical JSON, parse errors."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from dstack_plan.errors import StateError
from dstack_plan.state import (
    FORMAT_VERSION,
    ResourceState,
    State,
    canonical_json,
    parse_address,
    parse_state,
    prepare_write,
    spec_hash,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def resource(address: str = "fleet.gpu-pool", **overrides: object) -> ResourceState:
    fields: dict[str, object] = {
        "provider": "local",
        "spec": {"nodes": 2, "resources": {"gpu": "A100:2", "disk": "100GB"}},
        "status": "active",
        "now": NOW,
        "attributes": {"instances": ["i-1", "i-2"]},
        "depends_on": ["volume.data"],
    }
    fields.update(overrides)
    return ResourceState.create(address, **fields)  # type: ignore[arg-type]


def sample_state() -> State:
    return (
        State.empty()
        .with_resource(resource())
        .with_resource(resource("task.train", spec={"commands": ["python train.py"]}))
    )


class TestAddress:
    @pytest.mark.parametrize(
        "address", ["fleet.gpu-pool", "dev-environment.ide", "task.train_2", "volume.0data"]
    )
    def test_valid(self, address: str) -> None:
        kind, name = parse_address(address)
        assert f"{kind}.{name}" == address

    @pytest.mark.parametrize(
        "address", ["fleet", "Fleet.a", "fleet.", ".a", "fleet.a.b", "fleet.a b", "1x.a", ""]
    )
    def test_invalid(self, address: str) -> None:
        with pytest.raises(ValueError, match="invalid resource address"):
            parse_address(address)

    def test_state_key_must_match_resource(self) -> None:
        data = json.loads(State.empty().with_resource(resource()).to_json())
        data["resources"]["fleet.other"] = data["resources"].pop("fleet.gpu-pool")
        with pytest.raises(ValidationError, match="make the address 'fleet.gpu-pool'"):
            State.model_validate(data)

    def test_depends_on_validated_sorted_and_not_self(self) -> None:
        r = resource(depends_on=["volume.b", "gateway.a", "volume.b"])
        assert r.depends_on == ("gateway.a", "volume.b")
        with pytest.raises(ValidationError, match="invalid resource address"):
            resource(depends_on=["not-an-address"])
        with pytest.raises(ValidationError, match="depends on itself"):
            resource(depends_on=["fleet.gpu-pool"])


class TestSpecHash:
    def test_stable_across_key_order(self) -> None:
        a = {"x": 1, "y": {"b": [1, 2], "a": None}}
        b = {"y": {"a": None, "b": [1, 2]}, "x": 1}
        assert spec_hash(a) == spec_hash(b)
        expected = hashlib.sha256(b'{"x":1,"y":{"a":null,"b":[1,2]}}').hexdigest()
        assert spec_hash(a) == expected

    def test_changes_with_content(self) -> None:
        assert spec_hash({"x": 1}) != spec_hash({"x": 2})
        assert spec_hash({"x": [1, 2]}) != spec_hash({"x": [2, 1]})

    def test_filled_on_create_and_checked_on_load(self) -> None:
        r = resource()
        assert r.spec_hash == spec_hash(r.spec)
        tampered = r.model_dump(mode="json") | {"spec": {"nodes": 3}}
        with pytest.raises(ValidationError, match="does not match spec"):
            ResourceState.model_validate(tampered)


class TestResourceUpdates:
    def test_no_change_returns_same_object(self) -> None:
        r = resource()
        later = NOW + timedelta(hours=1)
        assert r.updated(now=later, status="active", spec=dict(r.spec)) is r

    def test_change_moves_updated_at_and_rehashes(self) -> None:
        r = resource()
        later = NOW + timedelta(hours=1)
        changed = r.updated(now=later, spec={"nodes": 3})
        assert changed.updated_at == later and changed.created_at == NOW
        assert changed.spec_hash == spec_hash({"nodes": 3}) != r.spec_hash

    def test_unknown_field_refused(self) -> None:
        with pytest.raises(TypeError, match="cannot update kind"):
            resource().updated(now=NOW, kind="task")

    def test_timestamps_normalised_to_utc(self) -> None:
        tz = timezone(timedelta(hours=2))
        r = resource(now=datetime(2025, 1, 2, 5, 4, 5, tzinfo=tz))
        assert r.created_at == NOW and r.created_at.tzinfo == timezone.utc
        assert '"created_at": "2025-01-02T03:04:05Z"' in State.empty().with_resource(r).to_json()
        with pytest.raises(ValidationError):
            resource(now=datetime(2025, 1, 2))  # naive: ambiguous across machines


class TestStateHelpers:
    def test_empty_has_fresh_uuid4_lineage_and_serial_zero(self) -> None:
        a, b = State.empty(), State.empty()
        assert a.serial == 0 and a.resources == {}
        assert uuid.UUID(a.lineage).version == 4 and a.lineage != b.lineage

    def test_with_resource_and_without_keep_lineage_and_serial(self) -> None:
        base = State.empty()
        added = base.with_resource(resource())
        assert base.resources == {}  # the original is untouched
        assert (added.lineage, added.serial) == (base.lineage, base.serial)
        assert added.addresses == ["fleet.gpu-pool"]
        removed = added.without("fleet.gpu-pool")
        assert removed.resources == {} and removed.lineage == base.lineage
        assert removed.without("fleet.gpu-pool") is removed

    def test_with_same_resource_is_identity(self) -> None:
        state = sample_state()
        assert state.with_resource(resource()) is state

    def test_frozen(self) -> None:
        with pytest.raises(ValidationError):
            sample_state().serial = 5  # type: ignore[misc]


class TestSerialAssignment:
    def test_first_write_gets_serial_one_and_empty_over_nothing_is_noop(self) -> None:
        assert prepare_write(None, State.empty(), "s") is None
        written = prepare_write(None, sample_state(), "s")
        assert written is not None and written.serial == 1

    def test_bumps_only_on_content_change(self) -> None:
        current = sample_state().model_copy(update={"serial": 7})
        assert prepare_write(current, current.model_copy(update={"serial": 3}), "s") is None
        changed = current.without("task.train")
        written = prepare_write(current, changed, "s")
        assert written is not None and written.serial == 8
        assert written.lineage == current.lineage

    def test_other_lineage_refused(self) -> None:
        current = sample_state()
        other = State.empty().with_resource(resource())
        with pytest.raises(StateError, match="unrelated state of lineage"):
            prepare_write(current, other, "s")


class TestFileFormat:
    def test_round_trip_is_byte_identical(self) -> None:
        state = sample_state()
        text = state.to_json()
        parsed = parse_state(text.encode(), "state.json")
        assert parsed == state
        assert parsed.to_json() == text

    def test_canonical_json_independent_of_insertion_order(self) -> None:
        one = sample_state()
        reordered = {a: one.resources[a] for a in reversed(one.addresses)}
        spec_reordered = {
            a: ResourceState.model_validate(
                {**r.model_dump(), "spec": dict(reversed(list(r.spec.items())))}
            )
            for a, r in reordered.items()
        }
        two = one.model_copy(update={"resources": spec_reordered})
        assert two.to_json() == one.to_json()
        text = one.to_json()
        assert text.endswith("}\n") and '\n  "format_version": 1,\n' in text
        keys = list(json.loads(text))
        assert keys == sorted(keys)

    @pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
    def test_non_finite_numbers_are_refused_not_written_as_null(self, value: float) -> None:
        with pytest.raises(ValueError, match="NaN and infinities"):
            canonical_json({"spec": {"max_price": value}})
        with pytest.raises(ValueError, match="NaN and infinities"):
            canonical_json({"max_price": [1, {"a": value}]})

    def test_state_that_mentions_nan_in_a_string_still_parses(self) -> None:
        state = State.empty().with_resource(resource(spec={"commands": ["echo NaN Infinity"]}))
        assert parse_state(state.to_json().encode(), "s") == state

    def test_unicode_kept_readable(self) -> None:
        state = State.empty().with_resource(resource(spec={"title": "Grüße"}))
        assert "Grüße" in state.to_json()
        assert parse_state(state.to_json().encode(), "s") == state

    @pytest.mark.parametrize(
        ("content", "problem"),
        [
            (b"", "state file is empty"),
            (b"{not json", "not valid JSON: Expecting property name"),
            (b"\xff\xfe", "not UTF-8"),
            (b"[1, 2]", "must hold a JSON object, found list"),
            (b'{"serial": 1}', "no format_version"),
            (b'{"format_version": "1"}', "format_version must be an integer"),
            (b'{"format_version": 0}', "unknown state format_version 0"),
            (b'{"format_version": 1, "serial": NaN}', "NaN is not valid JSON"),
            (b'{"format_version": 1, "lineage": "x", "serial": 1}', "lineage: lineage must be"),
            # a fixed lineage: a test's id must be the same in every pytest-xdist worker
            (b'{"format_version": 1, "lineage": "6f1c2e4a-9b3d-4c8e-a7f5-0d2b4e6a8c1f"}', ""),
        ],
    )
    def test_corrupt_file_errors_name_the_path(self, content: bytes, problem: str) -> None:
        if not problem:  # serial defaults to 0, resources to empty: a minimal valid file
            assert parse_state(content, "x").serial == 0
            return
        with pytest.raises(StateError) as info:
            parse_state(content, "/p/.dstack/state.json")
        assert str(info.value).startswith("/p/.dstack/state.json: ")
        assert problem in str(info.value)

    def test_field_errors_listed_with_location(self) -> None:
        data = json.loads(sample_state().to_json())
        data["serial"] = "3"
        data["resources"]["task.train"]["status"] = 5
        data["resources"]["task.train"]["color"] = "red"
        with pytest.raises(StateError) as info:
            parse_state(json.dumps(data), "state.json")
        message = str(info.value)
        assert "state.json: invalid state file:" in message
        assert "  serial: Input should be a valid integer" in message
        assert '  resources["task.train"].status:' in message
        assert '  resources["task.train"].color: Extra inputs are not permitted' in message

    def test_newer_format_refused(self) -> None:
        data = json.loads(sample_state().to_json())
        data["format_version"] = FORMAT_VERSION + 1
        data["something_new"] = True
        with pytest.raises(StateError, match="format_version 2 is newer .* upgrade dstack-plan"):
            parse_state(json.dumps(data), "state.json")
