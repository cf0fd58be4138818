"""Issue 12 strictness rules beyond the verdicts of the conformance corpus: what a shorthand
means once accepted, and that specs stored before a rule existed stay readable."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.config.loader import load_text
from dstack_plan.config.runs import ServiceSpec, TaskSpec
from dstack_plan.plan.normalize import spec_from_normalized


def _spec(text: str) -> Any:
    resources, issues = load_text(text, "t.dstack.yml", name_hint="t")
    assert not issues, [i.message for i in issues]
    return resources[0].spec


@pytest.mark.parametrize(
    ("written", "local_path", "url", "path"),
    [
        ("C:\\src\\repo:/work", "C:\\src\\repo", None, "/work"),
        ("d:/src/repo", "d:/src/repo", None, "."),
        ("git@github.com:org/repo.git:~/repo", None, "git@github.com:org/repo.git", "~/repo"),
        ("alice@host:org/repo.git", None, "alice@host:org/repo.git", "."),
        ("https://github.com/o/r.git:/work", None, "https://github.com/o/r.git", "/work"),
    ],
)
def test_a_repo_shorthand_splits_as_dstack_splits_it(
    written: str, local_path: str | None, url: str | None, path: str
) -> None:
    spec = _spec(f"type: task\ncommands: [ls]\nrepos: ['{written}']\n")
    repo = spec.repos[0]
    assert (repo.local_path, repo.url, repo.path) == (local_path, url, path)


def test_a_windows_drive_is_part_of_a_files_local_path() -> None:
    spec = _spec("type: task\ncommands: [ls]\nfiles: ['C:\\src\\data:/data']\n")
    assert (spec.files[0].local_path, spec.files[0].path) == ("C:\\src\\data", "/data")


def test_replicas_wins_over_its_alias_count() -> None:
    spec = _spec(
        "type: service\nport: 80\ngroups:\n  - {replicas: 2, count: 3, commands: [serve]}\n"
    )
    count = spec.replica_groups()[0].replica_count()
    assert (count.min, count.max) == (2, 2)


def test_a_service_with_groups_survives_its_normalised_round_trip() -> None:
    # the normalised form writes the default `replicas` and `spot_policy` out beside `groups`
    spec = _spec(
        "type: service\nport: 80\ngroups:\n"
        "  - {count: 1, spot_policy: spot, image: ubuntu}\n  - {count: 0..2, scaling: "
        "{metric: rps, target: 5}, commands: [serve]}\n"
    )
    data = spec.model_dump(mode="json", exclude_none=True)
    assert spec_from_normalized("service", data) == spec


def test_specs_stored_before_the_path_rules_stay_readable() -> None:
    # accepted (and stored) before the rules existed; destroy must still read them
    stored = {
        "type": "task",
        "commands": ["ls"],
        "volumes": [{"name": "data", "path": "data"}, {"instance_path": "mnt", "path": "/m"}],
        "repos": [{"local_path": ".", "path": "~alice"}],
        "files": [{"local_path": "a", "path": "C:/a"}],
    }
    assert isinstance(spec_from_normalized("task", stored), TaskSpec)
    _, issues = load_text(
        "type: task\ncommands: [ls]\nvolumes: [{name: data, path: data}]\n", "t.dstack.yml"
    )
    assert [i.message for i in issues] == [
        "volumes.0.path: the container path must be absolute, got 'data'"
    ]


def test_a_stored_service_from_before_the_group_rules_stays_readable() -> None:
    stored = {
        "type": "service",
        "port": 80,
        "image": "ubuntu",
        "replicas": {"min": 1, "max": 1},
        "groups": [{"name": "a", "image": "debian"}, {"name": "a", "commands": ["x"]}],
    }
    assert isinstance(spec_from_normalized("service", stored), ServiceSpec)
