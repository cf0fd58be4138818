"""GPU discovery and utilisation, asked of the vendor tools found on PATH (nvidia-smi, amd-smi,
rocm-smi). No tool, or a tool that fails, means no GPUs: the agent still runs."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from typing import Any

log = logging.getLogger(__name__)

TOOL_TIMEOUT = 10.0
_NVIDIA_INVENTORY = ["--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"]
_NVIDIA_USAGE = [
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]


def _run(argv: list[str]) -> str | None:
    """stdout of a vendor tool, or None (logged) when it is missing, fails or hangs."""
    path = shutil.which(argv[0])
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("%s failed: %s", argv[0], e)
        return None
    if done.returncode != 0:
        log.warning("%s exited with %s: %s", argv[0], done.returncode, done.stderr.strip()[:500])
        return None
    return done.stdout


def _int(text: Any) -> int | None:
    match = re.search(r"\d+", str(text))
    return int(match.group()) if match else None


def parse_nvidia_inventory(text: str) -> list[dict[str, Any]]:
    """GPUs from `nvidia-smi --query-gpu=index,name,memory.total,uuid` CSV output."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        # A name containing commas would split; the first and last two fields are fixed.
        name = ", ".join(parts[1:-2])
        gpus.append(
            {
                "vendor": "nvidia",
                "name": name,
                "memory_mib": _int(parts[-2]) or 0,
                "index": int(parts[0]),
                "uuid": parts[-1],
            }
        )
    return gpus


def parse_amd_smi(static_json: str, list_json: str | None) -> list[dict[str, Any]]:
    """GPUs from `amd-smi static --asic --vram --json` (+ `amd-smi list --json` for UUIDs)."""
    data = json.loads(static_json)
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    uuids: dict[int, str] = {}
    if list_json:
        try:
            listed = json.loads(list_json)
            for item in listed if isinstance(listed, list) else []:
                if isinstance(item, dict) and "gpu" in item:
                    uuids[int(item["gpu"])] = str(item.get("uuid", ""))
        except (ValueError, TypeError):
            pass
    gpus = []
    for item in data:
        if not isinstance(item, dict) or "gpu" not in item:
            continue
        index = int(item["gpu"])
        asic = item.get("asic") or {}
        size = (item.get("vram") or {}).get("size")
        if isinstance(size, dict):
            memory = _int(size.get("value"))
            unit = str(size.get("unit", "MB")).upper()
        else:
            memory = _int(size)
            unit = str(size or "MB").upper()
        if memory is not None and "GB" in unit:
            memory *= 1024
        gpus.append(
            {
                "vendor": "amd",
                "name": str(asic.get("market_name") or asic.get("name") or "AMD GPU"),
                "memory_mib": memory or 0,
                "index": index,
                "uuid": uuids.get(index) or str(asic.get("asic_serial", "")),
            }
        )
    return gpus


def parse_rocm_smi(text: str) -> list[dict[str, Any]]:
    """GPUs from `rocm-smi --showproductname --showmeminfo vram --showuniqueid --json`."""
    data = json.loads(text)
    gpus = []
    for key, card in sorted(data.items()):
        match = re.fullmatch(r"card(\d+)", key)
        if not match or not isinstance(card, dict):
            continue
        total = next((v for k, v in card.items() if "VRAM Total Memory" in k), None)
        memory = _int(total)
        gpus.append(
            {
                "vendor": "amd",
                "name": str(card.get("Card Series") or card.get("Card series") or "AMD GPU"),
                "memory_mib": (memory // (1024 * 1024)) if memory else 0,
                "index": int(match.group(1)),
                "uuid": str(card.get("Unique ID", "")),
            }
        )
    return gpus


def detect_gpus() -> list[dict[str, Any]]:
    """The host's GPUs as {vendor, name, memory_mib, index, uuid}; empty when none are found."""
    text = _run(["nvidia-smi", *_NVIDIA_INVENTORY])
    if text is not None:
        return parse_nvidia_inventory(text)
    for parse in (_detect_amd_smi, _detect_rocm_smi):
        try:
            gpus = parse()
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("could not parse AMD GPU tool output: %s", e)
            continue
        if gpus is not None:
            return gpus
    return []


def _detect_amd_smi() -> list[dict[str, Any]] | None:
    static = _run(["amd-smi", "static", "--asic", "--vram", "--json"])
    if static is None:
        return None
    return parse_amd_smi(static, _run(["amd-smi", "list", "--json"]))


def _detect_rocm_smi() -> list[dict[str, Any]] | None:
    text = _run(
        ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showuniqueid", "--json"]
    )
    return None if text is None else parse_rocm_smi(text)


def gpu_usage() -> list[dict[str, Any]]:
    """Per-GPU {index, utilization_percent, memory_used_mib, memory_total_mib} (NVIDIA only)."""
    text = _run(["nvidia-smi", *_NVIDIA_USAGE])
    if text is None:
        return []
    usage = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        usage.append(
            {
                "index": int(parts[0]),
                "utilization_percent": _int(parts[1]),
                "memory_used_mib": _int(parts[2]),
                "memory_total_mib": _int(parts[3]),
            }
        )
    return usage
