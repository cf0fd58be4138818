"""Prometheus text exposition (format 0.0.4) of host, GPU and job metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dstack_plan.agent.hostfacts import memory

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class Family:
    """One metric name with its help, type and samples."""

    def __init__(self, name: str, kind: str, help_text: str):
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: list[tuple[dict[str, str], float]] = []

    def add(self, value: float | None, **labels: Any) -> Family:
        if value is not None:
            self.samples.append(({k: str(v) for k, v in labels.items()}, value))
        return self


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: list[Family]) -> str:
    """The exposition text; families without samples are left out."""
    lines = []
    for family in families:
        if not family.samples:
            continue
        lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            suffix = f"{{{label_text}}}" if label_text else ""
            lines.append(f"{family.name}{suffix} {_number(value)}")
    return "\n".join(lines) + "\n"


def cpu_seconds() -> dict[str, float]:
    """Cumulative CPU time per mode from /proc/stat (empty where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return {}
    ticks = os.sysconf("SC_CLK_TCK")
    values = fields[1 : 1 + len(_CPU_MODES)]
    return {_CPU_MODES[i]: int(v) / ticks for i, v in enumerate(values)}


_ARPHRD_LOOPBACK = "772"
# Intermediate functional blocks mirror another interface's traffic for shaping.
_MIRROR_PREFIXES = ("ifb",)


def _counted_interface(name: str, sys_net: Path) -> bool:
    """Whether an interface's bytes are this host's own traffic, counted once.

    Loopback never leaves the host. A bridge (docker0, br-*) and the virtual ends of container
    veth pairs plugged into it carry copies of packets that also cross the real NIC, so summing
    them would count a container's traffic two or three times. A physical NIC enslaved to a
    bridge still counts (the bridge does not)."""
    if name == "lo" or name.startswith(_MIRROR_PREFIXES):
        return False
    iface = sys_net / name
    try:
        if (iface / "type").read_text().strip() == _ARPHRD_LOOPBACK:
            return False
    except OSError:
        return True  # no sysfs (some containers): only the name rules apply
    if (iface / "bridge").is_dir():
        return False
    virtual = "/virtual/" in str(iface.resolve())
    return not (virtual and (iface / "brport").is_dir())


def network_bytes(
    proc_net_dev: str | Path = "/proc/net/dev", sys_net: str | Path = "/sys/class/net"
) -> dict[str, int]:
    """Bytes received (`rx`) and sent (`tx`) since boot, summed over the host's own interfaces
    (see `_counted_interface`); empty where /proc/net/dev cannot be read."""
    try:
        lines = Path(proc_net_dev).read_text().splitlines()[2:]  # two header lines
    except OSError:
        return {}
    rx = tx = 0
    for line in lines:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 9 or not _counted_interface(name.strip(), Path(sys_net)):
            continue
        rx += int(fields[0])
        tx += int(fields[8])
    return {"rx": rx, "tx": tx}


def host_families(
    uptime: float,
    job_counts: dict[str, int],
    gpu_usage: list[dict[str, Any]],
    allocations: dict[int, str],
    gpu_indices: list[int],
) -> list[Family]:
    """Every metric family the agent exposes."""
    families = [
        Family("dstack_agent_uptime_seconds", "gauge", "Seconds since the agent started").add(
            uptime
        )
    ]
    jobs = Family("dstack_agent_jobs", "gauge", "Jobs known to the agent, by status")
    for status, count in sorted(job_counts.items()):
        jobs.add(count, status=status)
    families.append(jobs)
    families.append(
        Family("dstack_agent_cpu_count", "gauge", "Logical CPUs").add(os.cpu_count() or 1)
    )
    cpu = Family("dstack_agent_cpu_seconds_total", "counter", "CPU time spent in each mode")
    for mode, seconds in cpu_seconds().items():
        cpu.add(seconds, mode=mode)
    families.append(cpu)
    load = Family("dstack_agent_load_average", "gauge", "System load average")
    try:
        one, five, fifteen = os.getloadavg()
        load.add(one, period="1m").add(five, period="5m").add(fifteen, period="15m")
    except OSError:
        pass
    families.append(load)
    net = Family(
        "dstack_agent_network_bytes_total",
        "counter",
        "Bytes through the host's network interfaces (loopback and bridges left out)",
    )
    for direction, count in network_bytes().items():
        net.add(count, direction=direction)
    families.append(net)
    mem = memory()
    families.append(
        Family("dstack_agent_memory_total_bytes", "gauge", "Physical memory").add(
            mem["total_bytes"]
        )
    )
    families.append(
        Family(
            "dstack_agent_memory_available_bytes", "gauge", "Memory available for new work"
        ).add(mem["available_bytes"])
    )
    util = Family("dstack_agent_gpu_utilization_percent", "gauge", "GPU utilisation")
    used = Family("dstack_agent_gpu_memory_used_bytes", "gauge", "GPU memory in use")
    total = Family("dstack_agent_gpu_memory_total_bytes", "gauge", "GPU memory")
    for gpu in gpu_usage:
        util.add(gpu["utilization_percent"], gpu=gpu["index"])
        if gpu["memory_used_mib"] is not None:
            used.add(gpu["memory_used_mib"] * 1024 * 1024, gpu=gpu["index"])
        if gpu["memory_total_mib"] is not None:
            total.add(gpu["memory_total_mib"] * 1024 * 1024, gpu=gpu["index"])
    allocated = Family(
        "dstack_agent_gpu_allocated",
        "gauge",
        "1 if the GPU is allocated to a job (label job), else 0",
    )
    for index in gpu_indices:
        job = allocations.get(index)
        allocated.add(1 if job else 0, gpu=index, job=job or "")
    families.extend([util, used, total, allocated])
    return families
