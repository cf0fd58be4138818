"""Who is applying: the user quotas count a run against."""

from __future__ import annotations

import getpass
import os

USER_ENV = "DSTACK_PLAN_USER"
"""Overrides the login name (a shared service account, CI, tests)."""


def current_user() -> str:
    """`DSTACK_PLAN_USER` when set, else the login name; `unknown` when neither is known
    (a container without a passwd entry)."""
    named = os.environ.get(USER_ENV, "").strip()
    if named:
        return named
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # getpass raises these when no name can be found
        return "unknown"
