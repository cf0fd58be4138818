"""What a controller needs to know about this host: OS, CPUs, memory, disk, addresses."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import struct
from pathlib import Path
from typing import Any

_SIOCGIFADDR = 0x8915


def memory() -> dict[str, int]:
    """{total_bytes, available_bytes} from /proc/meminfo (sysconf elsewhere)."""
    try:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
        return {"total_bytes": fields["MemTotal"], "available_bytes": fields["MemAvailable"]}
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        return {"total_bytes": total, "available_bytes": total}


def os_name() -> str:
    """The distribution's PRETTY_NAME, or `system release`."""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}"


def addresses() -> list[dict[str, str]]:
    """Interface addresses: the IPv4 one of each interface (ioctl) and IPv6 from /proc."""
    out: list[dict[str, str]] = []
    try:
        import fcntl  # noqa: PLC0415 - POSIX only

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(
                        s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                    )
                except OSError:
                    continue  # interface without an IPv4 address
                address = socket.inet_ntoa(packed[20:24])
                out.append({"interface": name, "family": "ipv4", "address": address})
    except (ImportError, OSError):
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    raw = parts[0]
                    groups = ":".join(raw[i : i + 4] for i in range(0, 32, 4))
                    address = socket.inet_ntop(
                        socket.AF_INET6, socket.inet_pton(socket.AF_INET6, groups)
                    )
                    out.append({"interface": parts[5], "family": "ipv6", "address": address})
    except OSError:
        pass
    return out


def host_facts(data_dir: Path) -> dict[str, Any]:
    """Facts that do not depend on docker or GPUs (the caller adds those)."""
    disk = shutil.disk_usage(data_dir)
    return {
        "hostname": socket.gethostname(),
        "os": os_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpus": os.cpu_count() or 1,
        "memory": memory(),
        "disk": {"path": str(data_dir), "total_bytes": disk.total, "free_bytes": disk.free},
        "addresses": addresses(),
        "python": platform.python_version(),
    }
