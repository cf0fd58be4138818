"""One command lists every job of ours on a cluster: Slurm's view and the job directories.

`listing_command(work_dir)` prints four sections, parsed by `parse_listing`:

    @@squeue   the user's jobs as squeue knows them (`states.SQUEUE_FORMAT`, job name first)
    @@down     nodes down or drained, with Slurm's reason
    @@nodes    every node with its address (`NodeAddr`): where a service's replica listens
    @@jobs     per job directory: `@job KEY`, its meta.json on one line, `@exit NODE CODE`
               for each node that ended, `@log NODE SIZE`, `@stopped` once we cancelled it

So a plan, a refresh or a watch tick costs one SSH command per cluster, whatever the number
of runs (as an agent's job listing costs one request per host).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dstack_plan.providers.slurm.login import shell_path
from dstack_plan.providers.slurm.states import (
    SQUEUE_FORMAT,
    QueuedJob,
    parse_by_node,
    parse_squeue,
)

JOB_NAME_PREFIX = "dstack-plan."
"""Our Slurm jobs' names: this and the job's key (its directory's name)."""
META = "meta.json"
STOPPED = "stopped"
NAMED_FORMAT = f"%j|{SQUEUE_FORMAT}"
"""`states.SQUEUE_FORMAT` with the job's name first."""


def listing_command(work_dir: str) -> str:
    """The shell line that prints the listing (see the module doc)."""
    work = shell_path(work_dir)
    return "\n".join(
        [
            "echo @@squeue",
            f"squeue --me -t all -h -o '{NAMED_FORMAT}' 2>&1",
            "echo @@down",
            "sinfo -h -N -R -o '%n|%E' 2>/dev/null",
            "echo @@nodes",
            "sinfo -h -N -o '%n|%o' 2>/dev/null",
            "echo @@jobs",
            f"cd {work} 2>/dev/null || exit 0",
            "for d in */; do",
            '  d=${d%/}; [ -f "$d/meta.json" ] || continue',
            "  printf '@job %s\\n' \"$d\"",
            "  tr -d '\\n' < \"$d/meta.json\"; echo",
            '  for f in "$d"/exit-*; do [ -f "$f" ] && printf \'@exit %s %s\\n\' '
            '"${f##*/exit-}" "$(head -c 16 "$f")"; done',
            '  for f in "$d"/node-*.log; do [ -f "$f" ] && n=${f##*/node-} && '
            'printf \'@log %s %s\\n\' "${n%.log}" "$(wc -c < "$f")"; done',
            f'  [ -f "$d/{STOPPED}" ] && echo @stopped',
            "done",
            "true",
        ]
    )


@dataclass
class JobDir:
    """One job directory: what we submitted (meta.json) and what its nodes left."""

    key: str
    meta: dict[str, Any]
    exits: dict[int, int] = field(default_factory=dict)
    log_sizes: dict[int, int] = field(default_factory=dict)
    stopped: bool = False

    @property
    def job_ids(self) -> list[str]:
        ids = self.meta.get("ids")
        return [str(i) for i in ids] if isinstance(ids, list) else []


@dataclass
class Listing:
    """What one listing command said."""

    queued: dict[str, QueuedJob]
    """By job key (the name without `JOB_NAME_PREFIX`); the newest submission of a name."""
    down: dict[str, str]
    jobs: dict[str, JobDir]
    addresses: dict[str, str] = field(default_factory=dict)
    """Node -> the address Slurm reaches it at (`NodeAddr`)."""
    squeue_error: str | None = None
    """What squeue printed instead of jobs (slurmctld down, say); None when it answered."""


def parse_listing(text: str) -> Listing:
    """The sections of `listing_command`'s output."""
    sections: dict[str, list[str]] = {"squeue": [], "down": [], "nodes": [], "jobs": []}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@@") and line[2:].strip() in sections:
            current = sections[line[2:].strip()]
            continue
        if current is not None:
            current.append(line)
    queued, error = _queued(sections["squeue"])
    return Listing(
        queued=queued,
        down=parse_by_node("\n".join(sections["down"])),
        addresses=parse_by_node("\n".join(sections["nodes"])),
        jobs=_job_dirs(sections["jobs"]),
        squeue_error=error,
    )


def _queued(lines: list[str]) -> tuple[dict[str, QueuedJob], str | None]:
    named: dict[str, QueuedJob] = {}
    errors = []
    for line in lines:
        name, bar, rest = line.partition("|")
        if not bar:
            if line.strip():
                errors.append(line.strip())
            continue
        if not name.startswith(JOB_NAME_PREFIX):
            continue
        for job in parse_squeue(rest).values():
            key = name[len(JOB_NAME_PREFIX) :]
            older = named.get(key)
            if older is None or int(job.slurm_id) > int(older.slurm_id):
                named[key] = job
    return named, ("; ".join(errors) if errors and not named else None)


def _job_dirs(lines: list[str]) -> dict[str, JobDir]:
    found: dict[str, JobDir] = {}
    current: JobDir | None = None
    expect_meta = False
    for line in lines:
        if line.startswith("@job "):
            current = JobDir(line[5:].strip(), {})
            expect_meta = True
            continue
        if current is None:
            continue
        if expect_meta:
            expect_meta = False
            try:
                meta = json.loads(line)
            except ValueError:
                current = None  # half written (a submit cut short): not ours to show
                continue
            if isinstance(meta, dict):
                current.meta = meta
                found[current.key] = current
            continue
        words = line.split()
        if line.startswith("@exit ") and len(words) == 3 and _ints(words[1:]):
            current.exits[int(words[1])] = int(words[2])
        elif line.startswith("@log ") and len(words) == 3 and _ints(words[1:]):
            current.log_sizes[int(words[1])] = int(words[2])
        elif line.strip() == "@stopped":
            current.stopped = True
    return found


def _ints(words: list[str]) -> bool:
    return all(w.lstrip("-").isdigit() for w in words)
