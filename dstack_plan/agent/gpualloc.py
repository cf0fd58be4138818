"""Which GPU indices belong to which job, and how much of each: whole GPUs are held alone, a
shared job holds thousandths of one GPU, and the holdings of one GPU never sum above 1000."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

WHOLE = 1000
"""A whole GPU, in thousandths."""


class GpuUnavailable(Exception):
    """A job's GPU request cannot be met; `status` is 422 if it never can, 409 if busy."""

    def __init__(self, message: str, status: int):
        self.status = status
        super().__init__(message)


def _plural(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def percent(thousandths: int) -> str:
    """`50%`, `12.5%`: thousandths of a GPU as people write them."""
    return f"{thousandths / 10:g}%"


class GpuAllocator:
    """GPU indices of this host and, per index, the jobs holding it and how much."""

    def __init__(self, indices: Iterable[int] = (), memory_mib: Mapping[int, int] | None = None):
        self._lock = threading.Lock()
        self._indices = sorted(set(indices))
        self._memory = dict(memory_mib or {})
        self._held: dict[int, dict[str, int]] = {}

    def set_inventory(
        self, indices: Iterable[int], memory_mib: Mapping[int, int] | None = None
    ) -> None:
        """Replace the known GPUs (after a new detection); allocations are kept."""
        with self._lock:
            self._indices = sorted(set(indices))
            if memory_mib is not None:
                self._memory = dict(memory_mib)

    def memory_mib(self, index: int) -> int | None:
        """The memory of GPU `index` as detected, None when unknown."""
        with self._lock:
            return self._memory.get(index) or None

    def _free_of(self, index: int) -> int:
        return WHOLE - sum(self._held.get(index, {}).values())

    def free(self) -> list[int]:
        """Indices nobody holds any part of."""
        with self._lock:
            return [i for i in self._indices if not self._held.get(i)]

    def allocations(self) -> dict[int, str]:
        """Index -> holding job id(s), comma-joined when several jobs share the GPU."""
        with self._lock:
            return {i: ",".join(sorted(h)) for i, h in sorted(self._held.items()) if h}

    def shares(self) -> dict[int, dict[str, int]]:
        """Index -> job id -> thousandths held (1000 for a whole GPU)."""
        with self._lock:
            return {i: dict(sorted(h.items())) for i, h in sorted(self._held.items()) if h}

    def _detail(self) -> str:
        """`free indices: [1]; in use: 0 by job a, GPU 2: 30% free (job b 50%, job c 20%)`:
        what error messages say about the host's GPUs."""
        free = [i for i in self._indices if not self._held.get(i)]
        used = []
        for i, held in sorted(self._held.items()):
            if list(held.values()) == [WHOLE]:
                used.append(f"{i} by job {next(iter(held))}")
            elif held:
                jobs = ", ".join(f"job {j} {percent(n)}" for j, n in sorted(held.items()))
                used.append(f"GPU {i}: {percent(self._free_of(i))} free ({jobs})")
        return f"free indices: {free or 'none'}" + (f"; in use: {', '.join(used)}" if used else "")

    def allocate(self, job_id: str, request: Any, share: int | None = None) -> list[int]:
        """Give `job_id` a count (lowest free first) or the exact indices of `request`; with
        `share` (thousandths), that part of one GPU: the fullest one it still fits."""
        with self._lock:
            if isinstance(request, tuple):
                chosen = self._explicit(list(request), share)
            elif share is not None:
                chosen = self._best_fit(int(request), share)
            else:
                chosen = self._count(int(request))
            amount = WHOLE if share is None else share
            for i in chosen:
                self._held.setdefault(i, {})[job_id] = amount
            return chosen

    def _explicit(self, request: list[int], share: int | None) -> list[int]:
        missing = [i for i in request if i not in self._indices]
        if missing:
            raise GpuUnavailable(
                f"gpus: asked for GPU indices {request} but this host has "
                f"{self._indices or 'no GPUs'} ({self._detail()})",
                422,
            )
        if share is not None:
            [index] = request  # the spec allows a share of one GPU only
            if self._free_of(index) < share:
                raise GpuUnavailable(
                    f"gpus: asked for {percent(share)} of GPU {index} but it has "
                    f"{percent(self._free_of(index))} free ({self._detail()})",
                    409,
                )
            return request
        taken = [i for i in request if self._held.get(i)]
        if taken:
            raise GpuUnavailable(
                f"gpus: asked for GPU indices {request} but {taken} are in use ({self._detail()})",
                409,
            )
        return request

    def _best_fit(self, count: int, share: int) -> list[int]:
        if count != 1:
            raise GpuUnavailable(f"gpus: a share is of one GPU, not of {_plural(count)}", 422)
        if not self._indices:
            raise GpuUnavailable(
                f"gpus: asked for {percent(share)} of one GPU but this host has none", 422
            )
        fitting = [(self._free_of(i), i) for i in self._indices if self._free_of(i) >= share]
        if not fitting:
            raise GpuUnavailable(
                f"gpus: asked for {percent(share)} of one GPU but no GPU has that much free "
                f"({self._detail()})",
                409,
            )
        return [min(fitting)[1]]

    def _count(self, count: int) -> list[int]:
        free = [i for i in self._indices if not self._held.get(i)]
        if count > len(self._indices):
            raise GpuUnavailable(
                f"gpus: asked for {_plural(count)} but this host has "
                f"{len(self._indices)} ({self._detail()})",
                422,
            )
        if count > len(free):
            raise GpuUnavailable(
                f"gpus: asked for {_plural(count)} but only {len(free)} "
                f"{'is' if len(free) == 1 else 'are'} free ({self._detail()})",
                409,
            )
        return free[:count]

    def claim(self, job_id: str, indices: Iterable[int], share: int | None = None) -> None:
        """Record an allocation made before a restart (the job still holds those GPUs)."""
        with self._lock:
            for i in indices:
                self._held.setdefault(i, {})[job_id] = WHOLE if share is None else share

    def release(self, job_id: str) -> None:
        """Free every GPU (or part of one) held by `job_id`."""
        with self._lock:
            for i in list(self._held):
                self._held[i].pop(job_id, None)
                if not self._held[i]:
                    del self._held[i]

    def snapshot(self) -> dict[str, Any]:
        """Total indices, holders per index (comma-joined) and shares, for /host and /metrics."""
        allocated = self.allocations()
        shares = self.shares()
        with self._lock:
            indices = list(self._indices)
        return {
            "indices": indices,
            "allocated": {str(i): j for i, j in allocated.items()},
            "shares": {str(i): h for i, h in shares.items()},
        }
