"""Health checks: one asyncio prober per replica, deciding when it may take traffic.

A replica takes traffic only after `ready_after` consecutive passing probes. A failing probe,
or a failure the proxy itself saw on a real request (`report_failure`, e.g. connection
refused), takes it out of rotation at once and resets the count. Probes keep running while a
replica is down, so it comes back once healthy again. The check itself is injected (the
proxy's HTTP check lives in `proxy/client.py`) and so is the clock, so tests can drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.proxy.model import ProbeSettings, Upstream

logger = logging.getLogger(__name__)

ProbeCheck = Callable[[Upstream, ProbeSettings], Awaitable[bool]]
"""Probe one replica once: True if it passed. Exceptions count as a failure."""
HealthListener = Callable[[str, str, bool], None]
"""Called with (service, replica id, up) whenever a replica goes up or down."""


class Prober:
    """The health of one replica: consecutive passes and whether it is up."""

    def __init__(
        self,
        service: str,
        upstream: Upstream,
        settings: ProbeSettings,
        check: ProbeCheck,
        listener: HealthListener,
        clock: Clock,
    ) -> None:
        self.service = service
        self.upstream = upstream
        self.settings = settings
        self.up = False
        self._passes = 0
        self._check = check
        self._listener = listener
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            name = f"probe {self.service}/{self.upstream.replica_id}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    def cancel(self) -> None:
        """Stop probing (the task ends at its next await)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def observe(self, passed: bool) -> None:
        """Count one probe's result."""
        if not passed:
            self.report_failure()
            return
        self._passes += 1
        if not self.up and self._passes >= self.settings.ready_after:
            self.up = True
            logger.info("replica %s/%s is up", self.service, self.upstream.replica_id)
            self._listener(self.service, self.upstream.replica_id, True)

    def report_failure(self) -> None:
        """The replica failed (a probe, or a real request): out of rotation at once."""
        self._passes = 0
        if self.up:
            self.up = False
            logger.warning("replica %s/%s is down", self.service, self.upstream.replica_id)
            self._listener(self.service, self.upstream.replica_id, False)

    async def _run(self) -> None:
        while True:
            try:
                passed = await asyncio.wait_for(
                    self._check(self.upstream, self.settings), self.settings.timeout
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a probe that raises has failed
                from dstack_plan.proxy.protocol_log import brief

                logger.debug("probe of %s failed: %s", self.upstream.url, brief(e))
                passed = False
            self.observe(passed)
            await self._clock.sleep(self.settings.interval)


class HealthMonitor:
    """The probers of every replica of every service, kept in step with the routes."""

    def __init__(
        self, check: ProbeCheck, listener: HealthListener, clock: Clock | None = None
    ) -> None:
        self._check = check
        self._listener = listener
        self._clock: Clock = clock or SystemClock()
        self._probers: dict[tuple[str, str], Prober] = {}

    def sync(self, service: str, upstreams: Sequence[Upstream], settings: ProbeSettings) -> None:
        """Probe exactly `upstreams` of `service`: new ones start (down), removed ones stop;
        one that stays keeps its state (a changed URL is a new replica)."""
        wanted = {u.replica_id: u for u in upstreams}
        for key, prober in list(self._probers.items()):
            if key[0] != service:
                continue
            upstream = wanted.get(key[1])
            if upstream is None or upstream.url != prober.upstream.url:
                self._drop(key)
            else:
                prober.settings = settings
        for replica_id, upstream in wanted.items():
            if (service, replica_id) not in self._probers:
                prober = Prober(
                    service, upstream, settings, self._check, self._listener, self._clock
                )
                self._probers[(service, replica_id)] = prober
                prober.start()

    def remove_service(self, service: str) -> None:
        for key in [k for k in self._probers if k[0] == service]:
            self._drop(key)

    def report_failure(self, service: str, replica_id: str) -> None:
        prober = self._probers.get((service, replica_id))
        if prober is not None:
            prober.report_failure()

    def is_up(self, service: str, replica_id: str) -> bool:
        prober = self._probers.get((service, replica_id))
        return prober is not None and prober.up

    async def close(self) -> None:
        probers = list(self._probers.values())
        self._probers.clear()
        await asyncio.gather(*(p.stop() for p in probers))

    def _drop(self, key: tuple[str, str]) -> None:
        prober = self._probers.pop(key)
        if prober.up:
            self._listener(key[0], key[1], False)
        prober.cancel()  # not awaited: sync is called from synchronous code (set_routes)
