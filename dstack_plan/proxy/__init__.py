"""The service proxy: routes requests to healthy replicas of services, streamed both ways.

It owns replicas' health (probes), the choice of a replica per request (least connections),
auth, OpenAI-style model routing and request counts (`RequestStats.rps`, which watch's
autoscaler reads); it never decides how many replicas a service has (watch does), and knows
replicas only as the loopback URLs its caller gives it. `ServiceProxy` is loaded lazily so
that importing the models costs no aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dstack_plan.proxy.balancer import Balancer
from dstack_plan.proxy.model import ProbeSettings, ServiceRoute, Upstream
from dstack_plan.proxy.stats import RequestStats

if TYPE_CHECKING:
    from dstack_plan.proxy.server import ServiceProxy

__all__ = [
    "Balancer",
    "ProbeSettings",
    "RequestStats",
    "ServiceProxy",
    "ServiceRoute",
    "Upstream",
]


def __getattr__(name: str) -> Any:
    if name == "ServiceProxy":
        from dstack_plan.proxy.server import ServiceProxy

        return ServiceProxy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
