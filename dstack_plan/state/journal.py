"""The local backend's write-ahead journal: commits whose cost follows the change.

A large state is not rewritten on every commit. The commit appends one line to
`state.json.journal` holding what changed (the entries put, the addresses removed, the
exports or policy when they changed) and the serial it makes; once the journal holds as many
bytes as the state file, the next commit folds it: the whole state is written as before
(backup, history, atomic rename) and the journal emptied. A commit of one run into a
10,000-resource state then writes about 2 KB instead of 17 MB.

The state a reader sees is the state file plus the journal's lines that continue it: the
first line's serial is the file's serial + 1, each next line's one more, all of the file's
lineage. Reading stops at the first line that does not continue the chain or does not check
out (torn by a kill mid-append, its checksum wrong), so a reader always sees a state that was
committed, and a writer (under the write lock) cuts such a tail off before it appends. Lines
at or below the file's serial were folded already (a fold killed before it emptied the
journal) and are skipped.

Pure: encoding, decoding and replaying; `state/local.py` does the file work.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from itertools import compress
from operator import is_not
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.state.exports import Export
from dstack_plan.state.model import JsonObject, ResourceState, State


class JournalRecord(BaseModel):
    """One committed change, as a journal line stores it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lineage: str
    serial: int
    """The serial of the state this change makes."""
    put: dict[str, ResourceState] = {}
    """Entries added or replaced, by address."""
    removed: tuple[str, ...] = ()
    exports: dict[str, Export] | None = None
    """All exports, when they changed (else None: as before)."""
    policy: JsonObject | None = None
    """The published policy, when it changed."""


@dataclass(frozen=True)
class Replayed:
    """A state file's state with the journal's continuing lines applied."""

    state: State
    valid_end: int
    """Bytes of the journal read as whole, checked lines (stale ones included): where the
    next line goes; anything after it is a torn or foreign tail to cut off."""
    applied: int
    """Lines applied on top of the file (0: the journal adds nothing)."""


def change_of(old: State, new: State) -> JournalRecord:
    """The record that turns `old` into `new` (whose serial it carries). Entries are compared
    by identity first: a mutation replaces the entries it changes and keeps the others."""
    before, after = old.resources, new.resources
    touched = new.touched_since(old)
    if touched is not None:  # made from `old` step by step: only those steps' entries
        put = {a: after[a] for a in touched if a in after and before.get(a) != after[a]}
        removed = tuple(sorted(a for a in touched if a in before and a not in after))
    else:
        # the entries that are not the same objects, found at C speed (a state holds
        # thousands, a commit changes a few): only those are compared by value
        addresses = list(after)
        others = compress(addresses, map(is_not, map(before.get, addresses), after.values()))
        put = {a: after[a] for a in others if before.get(a) != after[a]}
        removed = tuple(sorted(before.keys() - after.keys()))
    return JournalRecord(
        lineage=new.lineage,
        serial=new.serial,
        put=put,
        removed=removed,
        exports=None if new.exports == old.exports else new.exports,
        policy=None if new.policy == old.policy else new.policy,
    )


def encode(record: JournalRecord) -> bytes:
    """One journal line: the record's JSON, a tab, its CRC-32 in hex, a newline."""
    fields = record.model_dump(mode="json")
    data = json.dumps(
        # exports or policy emptied stay `{}`: None (left out) means unchanged
        {k: v for k, v in fields.items() if v is not None and (v or k not in ("put", "removed"))},
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
    ).encode()
    return data + b"\t" + f"{zlib.crc32(data):08x}".encode() + b"\n"


def _decode(line: bytes) -> JournalRecord | None:
    """The record on a line (without its newline), or None when it does not check out."""
    body, tab, crc = line.rpartition(b"\t")
    if not tab or crc != f"{zlib.crc32(body):08x}".encode():
        return None
    try:
        return JournalRecord.model_validate_json(body, strict=True)
    except ValidationError:
        return None


def apply_record(state: State, record: JournalRecord) -> State:
    """`state` with `record`'s change made, at the record's serial."""
    resources = state.resources
    if record.put or record.removed:
        resources = dict(resources)
        for address in record.removed:
            resources.pop(address, None)
        resources.update(record.put)
    update: dict[str, Any] = {"resources": resources, "serial": record.serial}
    if record.exports is not None:
        update["exports"] = record.exports
    if record.policy is not None:
        update["policy"] = record.policy
    return state.model_copy(update=update)


def replay(base: State, data: bytes, start: int = 0) -> Replayed:
    """`base` (a state file's state, or that state with the lines before `start` applied)
    with the lines of journal `data` from byte `start` that continue it."""
    state, offset, applied = base, start, 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        if end < 0:
            break  # a line torn before its newline
        record = _decode(data[offset:end])
        if record is None or record.lineage != base.lineage:
            break
        if record.serial > state.serial:
            if record.serial != state.serial + 1:
                break  # does not continue this state: another history's line
            state = apply_record(state, record)
            applied += 1
        offset = end + 1
    return Replayed(state=state, valid_end=offset, applied=applied)
