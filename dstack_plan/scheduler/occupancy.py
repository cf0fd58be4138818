"""How much of each GPU of a host is free, given what holds it. Pure.

A whole-GPU job holds its GPUs alone; a shared job holds a part (thousandths) of one GPU, and
the parts on one GPU never sum above a whole one. Jobs that already run name their GPUs (the
agent said which); a job being placed does not yet, so it is given GPUs by the agent's own
rule (`agent/gpualloc.py`): whole GPUs are the lowest-numbered ones nobody holds, a share goes
to the GPU with the least free capacity that still fits it (lowest index on ties), so shares
pack onto one GPU and leave the others whole. The scheduler and the agent then agree on what
is free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from dstack_plan.config.gpu_share import WHOLE


class Holder(Protocol):
    """What holds GPUs: a job running on the host, or one being placed there."""

    @property
    def gpus(self) -> int: ...

    @property
    def gpu_share(self) -> int: ...

    @property
    def gpu_indices(self) -> tuple[int, ...]: ...


def gpu_free(count: int, holders: Iterable[Holder]) -> list[int]:
    """Free thousandths per GPU index (0..count-1) once `holders` hold theirs.

    Holders that name their GPUs are counted first, the others then take GPUs by the agent's
    rule; a holder that no longer fits (an agent that reported more than it has) takes what
    is left, never below zero."""
    free = [WHOLE] * count
    unplaced: list[Holder] = []
    for holder in holders:
        if not holder.gpus:
            continue
        if not holder.gpu_indices:
            unplaced.append(holder)
            continue
        for index in holder.gpu_indices:
            if 0 <= index < count:
                free[index] = max(free[index] - min(holder.gpu_share, WHOLE), 0)
    for holder in unplaced:
        taken = take(free, holder.gpus, holder.gpu_share)
        if taken is None:
            taken = tuple(sorted(range(count), key=lambda i: -free[i])[: holder.gpus])
        for index in taken:
            free[index] = max(free[index] - min(holder.gpu_share, WHOLE), 0)
    return free


def take(free: Sequence[int], gpus: int, share: int = WHOLE) -> tuple[int, ...] | None:
    """The GPU indices a job asking `gpus` GPUs (or `share` of one) gets, by the agent's rule;
    None when they are not free."""
    if share >= WHOLE:
        whole = [i for i, f in enumerate(free) if f >= WHOLE]
        return tuple(whole[:gpus]) if len(whole) >= gpus else None
    fitting = [(f, i) for i, f in enumerate(free) if f >= share]
    return (min(fitting)[1],) if fitting else None


def percent(share: int) -> str:
    """`25%`, `12.5%`: a share in thousandths, as people write it."""
    return f"{share / 10:g}%"
