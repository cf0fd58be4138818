"""A process job whose one command is a plain program call runs without a shell.

`sh -c "python train.py"` keeps the shell as the job's main process (dash does not replace
itself with the command), so each such job is two processes: 10,000 of them on one host take
20,000 pids, and the kernel's per-process work (forks, exits, the memory monitor's walk over
every mapping of a shared page) twice over. A command the shell would do nothing to but split
into words (no quoting, expansion, redirection, operator, assignment, builtin or keyword) is
executed as those words instead, as the shell itself would execute it: the same argv, found
on the same `PATH`, in the same working directory, environment and process group.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:,@%+=-]+")
"""Characters the shell gives no meaning to inside a word (an `=` matters only in the first)."""
_SEPARATORS = re.compile(r"[ \t]+")
_SHELL_WORDS = frozenset(
    {
        # builtins whose behaviour differs from a program of the same name, or that exist as
        # programs only to mimic the builtin (`/usr/bin/cd` on some distributions)
        *("alias", "bg", "cd", "command", "echo", "false", "fc", "fg", "getopts", "hash"),
        *("jobs", "kill", "printf", "pwd", "read", "test", "time", "true", "type", "ulimit"),
        *("umask", "unalias", "wait"),
        # special builtins and keywords, in case a program is named after one
        *("break", "continue", "eval", "exec", "exit", "export", "local", "readonly"),
        *("return", "set", "shift", "source", "times", "trap", "unset"),
        *("case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in", "then"),
        *("until", "while"),
    }
)


def direct_argv(commands: Sequence[str], path: str | None, cwd: Path) -> list[str] | None:
    """`commands` as the argv to execute without a shell, or None when they need one: more or
    other than one command of plain words, or a first word that is no executable file (on
    `path`, or relative to `cwd` when it has a `/`), which the shell then reports as it does.
    """
    if len(commands) != 1:
        return None
    words = _SEPARATORS.split(commands[0].strip(" \t"))
    if not all(_PLAIN_WORD.fullmatch(word) for word in words):
        return None
    program = words[0]
    if "=" in program or program in _SHELL_WORDS:
        return None
    if "/" in program:  # relative to the working directory, as the shell would look
        target = cwd / program
        runnable = target.is_file() and os.access(target, os.X_OK)
    else:
        runnable = shutil.which(program, path=path or os.defpath) is not None
    return words if runnable else None
