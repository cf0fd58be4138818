"""The `dstack` console script (also `python -m dstack_plan.cli`).

The garbage collector is tuned first, before typer and pydantic are imported: the objects
those imports create live until exit, so collecting them is wasted work. It stays off until
the command's work begins (`cli.common.run_with`).
"""

from __future__ import annotations


def main() -> None:
    from dstack_plan.gcpause import collect_less_often, pause_for_startup, spare_exit_collection

    pause_for_startup()
    collect_less_often()
    spare_exit_collection()
    from dstack_plan.cli.app import main as run_command

    run_command()


if __name__ == "__main__":
    main()
