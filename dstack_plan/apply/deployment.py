"""The deployment key of a project's state, read from the state when first needed.

Jobs on a shared agent carry the key of the state that owns them (in their id and labels), so
one project never mistakes another's job of the same run name for its own. The key comes from
the state's lineage. A state that does not exist yet has no lineage of its own: each read of
it makes up a fresh one, and the first commit keeps whichever its own read made up. So the key
is read lazily, from the stored state: apply commits the intent entry of a create before it
submits any job, so by then the state exists and the jobs get the key of its real lineage
(also when the plan was made in another process, or a concurrent first apply won the race).
"""

from __future__ import annotations

import hashlib
import uuid

from dstack_plan.state.backend import StateBackend, StateSnapshot


class Deployment:
    """The deployment key of the state in `backend`; `str()` of it is the key."""

    def __init__(self, backend: StateBackend) -> None:
        self._backend = backend
        self._key: str | None = None

    @property
    def key(self) -> str:
        """The key of the stored state's lineage (read once, then remembered).

        For a state not written yet it is the key of a lineage nobody keeps, and it is not
        remembered: ask again once the state exists.
        """
        if self._key is not None:
            return self._key
        lineage = self._backend.read_lineage()
        if lineage is None:
            return deployment_key(str(uuid.uuid4()))
        self._key = deployment_key(lineage)
        return self._key

    def remember(self, snapshot: StateSnapshot) -> None:
        """Take the key from a snapshot just read (a plan reads the state anyway), so that
        asking for the key reads nothing more."""
        if self._key is None and snapshot.exists:
            self._key = deployment_key(snapshot.state.lineage)

    def __str__(self) -> str:
        return self.key

    def __repr__(self) -> str:
        return f"Deployment({self._backend.location!r})"


def deployment_key(lineage: str) -> str:
    """A short id of the state a run belongs to, from the state's lineage: fixed when the
    state is born and different for every state, wherever its file lives (two projects'
    `.dstack/state.json` are the same relative path). States from before hashed that path
    into six hex digits; these keys have eight, so the two kinds never collide."""
    return hashlib.sha1(lineage.encode()).hexdigest()[:8]
