"""Parsing state files, with errors that name the file and say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dstack_plan.errors import StateError
from dstack_plan.state.model import FORMAT_VERSION, State


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def format_location(loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as `resources["fleet.a"].spec_hash`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(top level)"


def _parse_well_formed(data: bytes | str) -> State | None:
    """One pass for the usual case, a state this code wrote; None sends it to the checks.

    pydantic's JSON parser takes NaN and Infinity, which are not JSON: text that spells them
    anywhere, even inside a string, goes the careful way.
    """
    markers = (b"NaN", b"Infinity") if isinstance(data, bytes) else ("NaN", "Infinity")
    if any(marker in data for marker in markers):  # type: ignore[operator]
        return None
    try:
        return State.model_validate_json(data, strict=True)
    except ValidationError:
        return None


def parse_state(data: bytes | str, source: str | Path) -> State:
    """Parse the text of a state file; `source` names it in every error.

    Raises StateError for bytes that are not UTF-8 JSON, for a missing or unknown
    `format_version` (a newer one asks the user to upgrade), and for content that does not
    match the model (each problem listed with its location).
    """
    fast = _parse_well_formed(data)
    if fast is not None:
        return fast
    where = str(source)
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise StateError(f"{where}: state file is not UTF-8 text (byte {err.start})") from None
    else:
        text = data
    if not text.strip():
        raise StateError(f"{where}: state file is empty")
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        # some of json's messages end in "at", meant to precede the position it appends
        reason = err.msg.removesuffix(" at")
        raise StateError(
            f"{where}: state file is not valid JSON: {reason} at line {err.lineno},"
            f" column {err.colno}"
        ) from None
    except ValueError as err:
        raise StateError(f"{where}: state file is not valid JSON: {err}") from None
    if not isinstance(raw, dict):
        raise StateError(
            f"{where}: state file must hold a JSON object, found {type(raw).__name__}"
        )
    version = raw.get("format_version")
    if version is None:
        raise StateError(f"{where}: no format_version; is this a dstack-plan state file?")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateError(f"{where}: format_version must be an integer, found {version!r}")
    if version > FORMAT_VERSION:
        raise StateError(
            f"{where}: state format_version {version} is newer than this dstack-plan supports"
            f" ({FORMAT_VERSION}); upgrade dstack-plan to use this state"
        )
    if version < 1:
        raise StateError(f"{where}: unknown state format_version {version}")
    try:
        return State.model_validate_json(text, strict=True)
    except ValidationError as err:
        problems = "\n".join(
            f"  {format_location(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors(include_url=False)
        )
        raise StateError(f"{where}: invalid state file:\n{problems}") from None
