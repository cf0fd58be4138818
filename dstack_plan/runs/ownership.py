"""Which agent jobs a run's state entry owns, so that a delete never removes anyone else's.

Several projects (states) may share one machine and its agent, and their runs may share
names. A job belongs to an entry when the entry records its id (among its current jobs or
those of its earlier attempts, `runs/attempts.py`), or, for jobs a create or
scale-up submitted but was cut short before recording, when its labels say so exactly: the
state's deployment key and the entry's generation.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.runs.attempts import kept_job_ids
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.model import ResourceState


def jobs_to_remove(
    current: ResourceState,
    listed: Sequence[JobInfo],
    deployment: str,
    replacement: ResourceState | None,
) -> set[str]:
    """The jobs a delete of run `current` removes: those it recorded (its earlier attempts'
    included), and those its own create
    or scale-up submitted but was cut short before recording, found among the agent's
    `listed` jobs of the run. Such a job is this object's only when it carries
    - this state's deployment key: `deployment` (from the lineage), or the one `current`
      recorded (states from before lineage keys hashed their path, which every project run
      from its own directory shares: the generation below tells those projects apart);
    - `current`'s generation; an intent entry (a create killed before it recorded anything)
      has none yet, and its create took the generation from the clock after committing the
      intent, so its jobs are those of this key with a generation no older than the intent.
    Any other job of the same run name belongs to another project or another object.

    Never the jobs of `replacement`, the object that replaced `current` at its address
    (create-before-destroy): the run's jobs share its name, and the new ones must live on.
    """
    record = RunRecord.of(current)
    spared: set[str] = set()
    spared_generation: str | None = None
    if replacement is not None:
        replaced_by = RunRecord.of(replacement)
        spared = set(replaced_by.job_ids()) | kept_job_ids(replacement.attributes)
        if replaced_by.generation is not None:
            spared_generation = str(replaced_by.generation)
    keys = {deployment} if record.deployment is None else {deployment, record.deployment}
    generation = None if record.generation is None else str(record.generation)
    # ms, as generations are; one less for the rounding of the intent's microseconds
    since = int(current.created_at.timestamp() * 1000) - 1
    ids = set(record.job_ids()) | kept_job_ids(current.attributes)
    for job in listed:
        key, job_generation, address = _job_labels(job)
        if key not in keys or job_generation is None or job_generation == spared_generation:
            continue
        if address is not None and address != current.address:
            continue  # a run of another kind with the same name
        if generation is not None and job_generation != generation:
            continue
        if generation is None and (not job_generation.isdigit() or int(job_generation) < since):
            continue
        ids.add(job.id)
    return ids - spared


def _job_labels(job: JobInfo) -> tuple[str | None, str | None, str | None]:
    """(deployment key, generation, address) of an agent job. Jobs from before the labels
    carry the first two only in their id, `<run>-<replica>-<node>-<generation>-<key>`."""
    labels = job.spec.get("labels") if isinstance(job.spec, dict) else None
    labels = labels if isinstance(labels, dict) else {}
    key, generation = labels.get("deployment"), labels.get("generation")
    parts = job.id.rsplit("-", 2)
    if len(parts) == 3 and parts[1].isdigit():
        key = parts[2] if key is None else key
        generation = parts[1] if generation is None else generation
    address = labels.get("address")
    return (
        None if key is None else str(key),
        None if generation is None else str(generation),
        None if address is None else str(address),
    )
