"""The `dstack` console script (also `python -m dstack_plan.cli`).

What is alive at exit is left out of the interpreter's last garbage collection
(`gcpause.spare_exit_collection`): a short command ends with tens of thousands of objects that
the process drops wholesale anyway.
"""

from __future__ import annotations


def main() -> None:
    from dstack_plan.gcpause import spare_exit_collection

    spare_exit_collection()
    from dstack_plan.cli.app import main as run_command

    run_command()


if __name__ == "__main__":
    main()
