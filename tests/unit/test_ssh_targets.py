"""SSH targets built from a fleet's ssh_config: per-host fields override the fleet's."""

from __future__ import annotations

import pytest

from dstack_plan.config.fleet import SSHConfig
from dstack_plan.errors import DstackPlanError
from dstack_plan.providers.ssh.models import SSHTarget, targets_from_config


def test_hosts_inherit_and_override_fleet_fields() -> None:
    config = SSHConfig.model_validate(
        {
            "user": "ubuntu",
            "identity_file": "~/.ssh/fleet",
            "port": 2200,
            "proxy_jump": {"hostname": "bastion", "user": "jump", "identity_file": "~/.ssh/j"},
            "hosts": [
                "10.0.0.1",
                {
                    "hostname": "10.0.0.2",
                    "port": 22,
                    "user": "me",
                    "ssh_key": {"public": "ssh-ed25519 AAAA", "private": "PRIVATE"},
                    "proxy_jump": {
                        "hostname": "b2",
                        "port": 2022,
                        "user": "u",
                        "identity_file": "k",
                    },
                },
            ],
        }
    )
    first, second = targets_from_config(config)
    assert first == SSHTarget(
        "10.0.0.1",
        "ubuntu",
        2200,
        "~/.ssh/fleet",
        None,
        SSHTarget("bastion", "jump", 22, "~/.ssh/j"),
    )
    assert first.name == "10.0.0.1:2200"  # hosts are unique by (hostname, port)
    assert second == SSHTarget(
        "10.0.0.2", "me", 22, "~/.ssh/fleet", "PRIVATE", SSHTarget("b2", "u", 2022, "k")
    )
    assert second.name == "10.0.0.2"


def test_a_host_with_no_user_is_an_error_not_a_guess() -> None:
    config = SSHConfig.model_validate(
        {"hosts": ["10.0.0.1", {"hostname": "10.0.0.2", "user": "u"}]}
    )
    with pytest.raises(DstackPlanError, match=r"^10\.0\.0\.1: no user to log in as"):
        targets_from_config(config)
