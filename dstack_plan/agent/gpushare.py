"""How a job sharing a GPU is held to its share: NVIDIA MPS limits when an MPS control daemon
runs on the host, otherwise plain time-slicing (the jobs take turns, nothing limits them).

Every job on a shared GPU sees the same device through the usual visible-devices variables
(`process_runtime.gpu_env`); this module adds what the share itself needs.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from typing import NamedTuple

log = logging.getLogger(__name__)

MPS = "mps"
TIME_SLICING = "time-slicing"
PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIR_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
SHARE_ENV = "DSTACK_GPU_SHARE"


class MpsDirs(NamedTuple):
    """Where the MPS control daemon listens (`control` socket) and logs."""

    pipe: str
    log: str


def mps_dirs(environ: Mapping[str, str] | None = None) -> MpsDirs:
    """The MPS directories as the daemon was started with them: the agent reads the same
    variables `nvidia-cuda-mps-control` does (so an operator, or a test, points both at one
    place), with NVIDIA's defaults."""
    env = os.environ if environ is None else environ
    pipe = env.get(PIPE_DIR_ENV) or DEFAULT_PIPE_DIR
    return MpsDirs(pipe, env.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR)


def mps_available(pipe_dir: str) -> bool:
    """An MPS control daemon runs: its pipe directory holds the `control` unix socket."""
    try:
        return stat.S_ISSOCK(os.stat(os.path.join(pipe_dir, "control")).st_mode)
    except OSError:
        return False


def sharing_mode(share: int | None, vendor: str | None, dirs: MpsDirs) -> str | None:
    """`mps`, `time-slicing`, or None for a job that holds whole GPUs (or none)."""
    if share is None:
        return None
    if vendor == "nvidia" and mps_available(dirs.pipe):
        return MPS
    return TIME_SLICING


def share_percent(share: int) -> str:
    """Thousandths as a percentage: `50`, `12.5`."""
    return f"{share / 10:g}"


def share_env(
    share: int | None, mode: str | None, memory_mib: int | None, dirs: MpsDirs
) -> dict[str, str]:
    """The variables a shared job gets, chosen once at submit time and kept in its record.

    Under MPS: the thread percentage (a whole number, at least 1: MPS takes integers) and a
    pinned memory limit of the share times the GPU's memory. The limit names device 0: the
    job sees its one GPU as device 0 in both runtimes (CUDA_VISIBLE_DEVICES=<index> for a
    process, only that device inside a container), and MPS counts devices as the client does.
    """
    if share is None:
        return {}
    env = {SHARE_ENV: share_percent(share)}
    if mode != MPS:
        return env
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(share / 10)))
    if memory_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_mib * share // 1000}M"
    else:
        log.warning("GPU memory unknown: the shared job gets no MPS memory limit")
    env[PIPE_DIR_ENV] = dirs.pipe
    env[LOG_DIR_ENV] = dirs.log
    return env
