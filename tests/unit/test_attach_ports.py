"""`dstack attach --port`: what it accepts, and the clear error for what it does not."""

from __future__ import annotations

import pytest

from dstack_plan.errors import DstackPlanError
from dstack_plan.inspect.ports import PortOverride


@pytest.mark.parametrize(
    ("text", "local", "container"), [("9000:8000", 9000, 8000), ("8000", 8000, 8000)]
)
def test_a_port_override_is_local_colon_container_or_one_port(
    text: str, local: int, container: int
) -> None:
    assert PortOverride.parse(text) == PortOverride(local, container)


@pytest.mark.parametrize("text", ["", "web", "9000:", "0:80", "9000:70000", "1:2:3"])
def test_a_malformed_port_override_says_what_is_expected(text: str) -> None:
    with pytest.raises(DstackPlanError, match="expected LOCAL:CONTAINER or PORT"):
        PortOverride.parse(text)
