"""Which GPU indices belong to which job, so two jobs never share a GPU by accident."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any


class GpuUnavailable(Exception):
    """A job's GPU request cannot be met; `status` is 422 if it never can, 409 if busy."""

    def __init__(self, message: str, status: int):
        self.status = status
        super().__init__(message)


def _plural(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


class GpuAllocator:
    """GPU indices of this host and the job holding each one."""

    def __init__(self, indices: Iterable[int] = ()):
        self._lock = threading.Lock()
        self._indices = sorted(set(indices))
        self._owner: dict[int, str] = {}

    def set_inventory(self, indices: Iterable[int]) -> None:
        """Replace the known GPUs (after a new detection); allocations are kept."""
        with self._lock:
            self._indices = sorted(set(indices))

    def free(self) -> list[int]:
        """Indices not allocated to any job."""
        with self._lock:
            return [i for i in self._indices if i not in self._owner]

    def allocations(self) -> dict[int, str]:
        """Index -> job id, for allocated GPUs."""
        with self._lock:
            return dict(self._owner)

    def allocate(self, job_id: str, request: Any) -> list[int]:
        """Give `job_id` a count (lowest free first) or the exact indices of `request`."""
        with self._lock:
            free = [i for i in self._indices if i not in self._owner]
            busy = ", ".join(f"{i} by job {j}" for i, j in sorted(self._owner.items()))
            detail = f"free indices: {free or 'none'}" + (f"; in use: {busy}" if busy else "")
            if isinstance(request, tuple):
                missing = [i for i in request if i not in self._indices]
                if missing:
                    raise GpuUnavailable(
                        f"gpus: asked for GPU indices {list(request)} but this host has "
                        f"{self._indices or 'no GPUs'} ({detail})",
                        422,
                    )
                taken = [i for i in request if i in self._owner]
                if taken:
                    raise GpuUnavailable(
                        f"gpus: asked for GPU indices {list(request)} but {taken} are in use "
                        f"({detail})",
                        409,
                    )
                chosen = list(request)
            else:
                count = int(request)
                if count > len(self._indices):
                    raise GpuUnavailable(
                        f"gpus: asked for {_plural(count)} but this host has "
                        f"{len(self._indices)} ({detail})",
                        422,
                    )
                if count > len(free):
                    raise GpuUnavailable(
                        f"gpus: asked for {_plural(count)} but only {len(free)} "
                        f"{'is' if len(free) == 1 else 'are'} free ({detail})",
                        409,
                    )
                chosen = free[:count]
            for i in chosen:
                self._owner[i] = job_id
            return chosen

    def claim(self, job_id: str, indices: Iterable[int]) -> None:
        """Record an allocation made before a restart (the job still holds those GPUs)."""
        with self._lock:
            for i in indices:
                self._owner[i] = job_id

    def release(self, job_id: str) -> None:
        """Free every GPU held by `job_id`."""
        with self._lock:
            for i in [i for i, j in self._owner.items() if j == job_id]:
                del self._owner[i]

    def snapshot(self) -> dict[str, Any]:
        """Total, free and allocated indices, for /host and /metrics."""
        with self._lock:
            return {
                "indices": list(self._indices),
                "allocated": {str(i): j for i, j in sorted(self._owner.items())},
            }
