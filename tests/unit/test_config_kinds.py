"""The kinds table: each `type:` value finds its model, and each kind says where it lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.base import KINDS
from dstack_plan.config.kinds import RUN_KINDS, spec_class
from dstack_plan.config.loader import load_project


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_finds_the_model_of_that_type(kind: str) -> None:
    assert spec_class(kind).model_fields["type"].default == kind


def test_an_unknown_kind_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        spec_class("cluster")
    assert RUN_KINDS < set(KINDS)


PROJECT = """\
type: fleet
name: ssh-pool
ssh_config: {user: ubuntu, hosts: [10.0.0.1]}
---
type: fleet
name: aws-pool
nodes: 1
backends: [aws]
---
type: fleet
name: anywhere
nodes: 1
---
type: volume
name: data
backend: gcp
region: europe-west4
size: 100GB
---
type: gateway
name: gw
backend: azure
region: westeurope
"""


def test_fleets_volumes_and_gateways_name_their_provider(tmp_path: Path) -> None:
    (tmp_path / "infra.dstack.yml").write_text(PROJECT)
    providers = {r.address: r.spec.provider for r in load_project(tmp_path)}
    assert providers == {
        "fleet.ssh-pool": "ssh",
        "fleet.aws-pool": "aws",
        "fleet.anywhere": "cloud",
        "volume.data": "gcp",
        "gateway.gw": "azure",
    }
