"""Where the time of one `dstack` command on an SSH fleet goes: runs the command in this
process with timers around its SSH and apply steps, then prints each step's span.

    python benchmarks/fanout_timing.py apply -y PROJECT    # any dstack arguments

For finding out why benchmarks/fanout.py misses a target; it measures, it changes nothing
(the timers wrap functions from outside, so a renamed function is reported, not fatal).
Times are seconds since the process started (interpreter start included, from
/proc/self/stat); a step run once per host shows its count, first start, last end, and the
median and longest single run.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

_EVENTS: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)


def _since_start() -> float:
    """Seconds since this process was created (clock ticks of /proc, so about 10 ms)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - started


_ORIGIN = time.perf_counter() - _since_start()


def _now() -> float:
    return time.perf_counter() - _ORIGIN


def _mark(label: str) -> None:
    at = _now()
    _EVENTS[label].append((at, at))


def _timed(label: str | Callable[..., str], function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (sync or async) recording each call's span under `label` (or
    `label(*args)`)."""

    def name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if isinstance(label, str):
            return label
        try:
            return label(*args, **kwargs)
        except Exception:  # noqa: BLE001 - its signature changed: time it all the same
            return function.__qualname__

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            started = _now()
            try:
                return await function(*args, **kwargs)
            finally:
                _EVENTS[name(args, kwargs)].append((started, _now()))

        return async_wrapper

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = _now()
        try:
            return function(*args, **kwargs)
        finally:
            _EVENTS[name(args, kwargs)].append((started, _now()))

    return wrapper


# (module, attribute path, label or a function of the call's arguments giving it)
_STEPS: list[tuple[str, str, str | Callable[..., str]]] = [
    ("dstack_plan.project", "Project.refresh", "project: refresh"),
    ("dstack_plan.project", "Project.plan", "project: plan (refresh included)"),
    ("dstack_plan.project", "Project.apply", "project: apply"),
    ("dstack_plan.state.local", "LocalBackend.read", "state: read"),
    ("dstack_plan.state.local", "LocalBackend.write", "state: write"),
    ("dstack_plan.fleets.ssh", "FleetHandler.refresh", "fleet: refresh"),
    ("dstack_plan.fleets.ssh", "FleetHandler.create", "fleet: create"),
    ("dstack_plan.providers.ssh.provider", "cached_bundle", "agent bundle: cache or build"),
    ("dstack_plan.providers.ssh.bundle", "write_zipapp", "agent bundle: build (cache miss)"),
    ("dstack_plan.providers.ssh.connect", "SSHPool._open", "ssh: connect (handshake, auth)"),
    ("dstack_plan.providers.ssh.provider", "preflight", "ssh: pre-flight"),
    ("dstack_plan.providers.ssh.provider", "install_agent", "agent: install (all steps)"),
    ("dstack_plan.providers.ssh.install", "_upload", "agent: sftp upload"),
    (
        "dstack_plan.providers.ssh.install",
        "_run",
        lambda conn, host, command, doing, *a, **k: f"agent: ssh command '{doing}'",
    ),
    ("dstack_plan.agent.client", "AgentClient.host_facts", "agent: host facts (tunnel)"),
    ("dstack_plan.providers.ssh.provider", "SSHProvider.close", "ssh: close"),
]


def _install() -> None:
    for module_name, path, label in _STEPS:
        try:
            owner: Any = importlib.import_module(module_name)
            *parents, attribute = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            setattr(owner, attribute, _timed(label, getattr(owner, attribute)))
        except (ImportError, AttributeError) as e:
            print(f"fanout_timing: cannot time {module_name}.{path}: {e}", file=sys.stderr)


def _report() -> None:
    _mark("exit")
    rows = sorted(_EVENTS.items(), key=lambda item: min(s for s, _ in item[1]))
    out = sys.stderr
    print(f"\n{'step':<44} {'n':>3} {'from s':>7} {'to s':>7} {'med s':>6} {'max s':>6}", file=out)
    for label, spans in rows:
        durations = [end - start for start, end in spans]
        print(
            f"{label:<44} {len(spans):>3} {min(s for s, _ in spans):>7.3f} "
            f"{max(e for _, e in spans):>7.3f} {statistics.median(durations):>6.3f} "
            f"{max(durations):>6.3f}",
            file=out,
        )


def main() -> None:
    _mark("interpreter started, timing imports begin")
    _install()
    _mark("timed modules imported (CLI imports follow)")
    atexit.register(_report)
    sys.argv = ["dstack", *sys.argv[1:]]
    from dstack_plan.cli.__main__ import main as dstack_main

    dstack_main()


if __name__ == "__main__":
    main()
