"""Who is applying: the user quotas count a run against."""

from __future__ import annotations

import functools
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
    return _login_name(os.getuid(), tuple(os.environ.get(name) for name in _LOGIN_ENV))


_LOGIN_ENV = ("LOGNAME", "USER", "LNAME", "USERNAME")
"""What `getpass.getuser` reads before the passwd entry, in its order."""


@functools.cache
def _login_name(uid: int, environment: tuple[str | None, ...]) -> str:
    """getpass's name for `uid` with `environment` (`_LOGIN_ENV`'s values): a passwd lookup
    once per process, not once per run an apply creates."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # getpass raises these when no name can be found
        return "unknown"
