"""The `dstack` console script (also `python -m dstack_plan.cli`).

What is alive at exit is left out of the interpreter's last garbage collection: a short
command ends with tens of thousands of objects (modules, model classes, validators) that the
process drops wholesale anyway; scanning them once more is a good part of a small command's
time. Without it, `benchmarks/cli_startup.py`'s `dstack plan` of its small project took
0.353 -> 0.428 s (+21%), and 0.368 -> 0.443 s (+20%) with the agent up (alternating with and
without in one session on the 2-core VM, medians of 9).
"""

from __future__ import annotations

import atexit
import gc


def main() -> None:
    # At exit, not now: a caller that goes on living (a test calling `main` in-process) keeps
    # a normal collector until its own exit.
    atexit.register(gc.freeze)
    from dstack_plan.cli.app import main as run_command

    run_command()


if __name__ == "__main__":
    main()
