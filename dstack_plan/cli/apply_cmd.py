"""`dstack apply` and `dstack destroy`: plan, confirm, make it so."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common
from dstack_plan.cli.plan_cmd import LabelOpt, labels_of
from dstack_plan.cli.policy_view import PolicyOpt

if TYPE_CHECKING:
    from dstack_plan.plan.lines import Line
    from dstack_plan.plan.model import Plan
    from dstack_plan.plan.policy_report import PolicyReport

ApproveOpt = typer.Option(False, "-y", "--auto-approve", "--yes", help="Skip the confirmation.")
InputOpt = typer.Option(True, "--input/--no-input", help="Ask for confirmation when needed.")
ParallelismOpt = typer.Option(10, "--parallelism", min=1, help="Resources changed at once.")


def apply(
    ctx: typer.Context,
    target_path: Path = typer.Argument(
        Path("."), help="Project directory, or a plan saved with `dstack plan -out`."
    ),
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    target: list[str] = common.TargetOpt,
    replace: list[str] = common.ReplaceOpt,
    allow_destroy: list[str] = common.AllowDestroyOpt,
    prune: bool = common.PruneOpt,
    label: list[str] = LabelOpt,
    policy: list[str] = PolicyOpt,
    auto_approve: bool = ApproveOpt,
    interactive: bool = InputOpt,
    parallelism: int = ParallelismOpt,
    lock_timeout: float = common.LockTimeoutOpt,
    attach: bool = typer.Option(
        False,
        "--attach",
        help="Forward the ports of the runs this apply starts to 127.0.0.1 here and stream "
        "their logs until they end.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Remove SSH hosts from fleets even when jobs run on them (they are stopped first).",
    ),
    take_over: bool = typer.Option(
        False,
        "--take-over",
        help="Move the claim of SSH hosts another project's fleet owns to this project's "
        "fleet (refused while the owner's jobs run there).",
    ),
) -> None:
    """Create, update or replace what the configuration declares.

    Arguments after `--` are the runs' `${{ run.args }}`: dstack apply . -- --lr 0.1
    """
    import shlex

    from dstack_plan.cli.app import RUN_ARGS
    from dstack_plan.plan.planner import PlanOptions

    saved = target_path.is_file()
    directory = Path(".") if saved else target_path
    run_args = shlex.join(ctx.meta.get(RUN_ARGS, []))
    project = common.make_project(
        directory, files, state, run_args=run_args, progress=print_progress
    )
    project.force = force
    project.take_over = take_over
    if saved and label:
        from dstack_plan.errors import PlanError

        raise PlanError(
            "--label cannot be used with a saved plan: it holds the labels it was made with"
        )
    project.labels = labels_of(label)
    if not saved:
        common.require_configuration(project)
    options = PlanOptions(
        targets=tuple(target),
        replace=tuple(replace),
        allow_destroy_protected=tuple(allow_destroy),
        prune=prune,
    )
    run_flow(
        project,
        options,
        saved_plan=str(target_path) if saved else None,
        approve=auto_approve or saved,
        interactive=interactive,
        parallelism=parallelism,
        lock_timeout=lock_timeout,
        attach=attach,
        policy_files=policy,
    )


def destroy(
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    target: list[str] = common.TargetOpt,
    allow_destroy: list[str] = common.AllowDestroyOpt,
    policy: list[str] = PolicyOpt,
    auto_approve: bool = ApproveOpt,
    interactive: bool = InputOpt,
    parallelism: int = ParallelismOpt,
    lock_timeout: float = common.LockTimeoutOpt,
    force: bool = typer.Option(
        False,
        "--force",
        help="Forget what cannot be cleaned (a host that does not answer), saying what is "
        "left there.",
    ),
) -> None:
    """Destroy everything in state (works after the configuration is gone)."""
    project = common.make_project(directory, files, state, progress=print_progress)
    project.force = force
    run_destroy(
        project,
        tuple(target),
        tuple(allow_destroy),
        approve=auto_approve,
        interactive=interactive,
        parallelism=parallelism,
        lock_timeout=lock_timeout,
        policy_files=policy,
    )


def run_destroy(
    project,  # noqa: ANN001 - Project, imported lazily
    targets: tuple[str, ...],
    allow_destroy: tuple[str, ...],
    **flow: Any,
) -> None:
    """Plan the destruction of `targets` and their dependents (everything when none), ask,
    destroy; exit 1 unless everything succeeded."""
    from dstack_plan.plan.planner import PlanOptions

    options = PlanOptions(destroy=True, targets=targets, allow_destroy_protected=allow_destroy)
    run_flow(project, options, saved_plan=None, attach=False, **flow)


def run_flow(project, options, **flow: Any) -> None:  # noqa: ANN001 - imported lazily
    """Run the apply flow; exit 1 unless everything succeeded. Ctrl-C before the changes
    begin (while refreshing, planning, asking) says nothing was changed and exits 130."""
    changing = _Changing()
    with (
        common.nothing_changed_on_interrupt(lambda: changing.began),
        common.no_leftover_state_dir(project),
    ):
        ok = common.run_with(project, lambda p: _apply_flow(p, options, changing, **flow))
    if not ok:
        raise typer.Exit(1)


class _Changing:
    """Whether the apply proper began (past it, its own interrupt handling decides)."""

    began = False


async def _publish(project, destroy: bool) -> None:  # noqa: ANN001 - Project, lazily
    """An apply publishes what importers obey (`Project.publish_policy`), and says so."""
    from dstack_plan.cli.output import print_lines

    if not destroy and await project.publish_policy():
        print_lines(["Published the projects' limits of .dstack/quotas.yml for importers."])


async def _apply_flow(
    project,  # noqa: ANN001 - Project, imported lazily
    options,  # noqa: ANN001
    changing: _Changing,
    *,
    saved_plan: str | None,
    approve: bool,
    interactive: bool,
    parallelism: int,
    lock_timeout: float,
    attach: bool,
    policy_files: list[str],
) -> bool:
    from dstack_plan.apply.interrupt import Interrupt
    from dstack_plan.cli.output import print_lines, progress
    from dstack_plan.cli.policy_view import enforce
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.plan.planfile import load_plan
    from dstack_plan.plan.render import render_plan

    destroy = options.destroy
    if not approve and not interactive:
        raise DstackPlanError(
            f"{'destroy' if destroy else 'apply'} needs confirmation: pass -y/--auto-approve "
            "(or apply a saved plan) when --no-input is set"
        )
    # the plan and the apply are one command: each machine's jobs are listed once for both
    # (`fleets/listings.py`)
    with project.machines.listings.kept():
        async with project.locked("destroy" if destroy else "apply", lock_timeout):
            if saved_plan is not None:
                plan = load_plan(saved_plan)
            else:
                with progress("Refreshing state and planning..."):
                    plan, _ = await project.plan(options)
            checked = _policy_report(plan, project.directory, policy_files, saved_plan)
            print_lines(render_plan(plan))
            enforce(checked)  # a denied plan is never applied, a saved one included
            if not plan.has_changes:
                await _publish(project, destroy)
                return True
            if not approve and not await _confirm(destroy):
                print_lines([f"{'Destroy' if destroy else 'Apply'} cancelled."])
                return False
            interrupt = Interrupt()
            changing.began = True
            with interrupt.signal_handlers():
                report = await project.apply(
                    plan,
                    saved_plan=saved_plan,
                    parallelism=parallelism,
                    interrupt=interrupt,
                    on_event=_print_event,
                )
            await _publish(project, destroy)  # after the changes: a new state is written by them
    print_lines(["", *_report_lines(report)])
    if attach and report.ok:
        from dstack_plan.cli.attach import attach_runs

        return await attach_runs(project, started_runs(plan)) and report.ok
    return report.ok


def _policy_report(
    plan: Plan, directory: Path, files: list[str], saved_plan: str | None
) -> PolicyReport | None:
    """Check the plan against the policies; a saved plan against those it was checked with
    (recorded in it), those given now and the project's, saying which outcomes changed."""
    from dstack_plan.cli.policy_view import check_policies

    if saved_plan is None:
        return check_policies(plan, directory, files)
    from dstack_plan.cli.output import print_lines
    from dstack_plan.plan.planfile import load_policy_record

    recorded = load_policy_record(saved_plan)
    before = {(r.file, r.name): r.outcome for r in recorded.rules} if recorded else {}
    # files given to plan are read again; the project's own are found again (one removed
    # since is a change to the project, not an error)
    given = dict.fromkeys(f for f, _ in before if not f.startswith(".dstack/policies/"))
    report = check_policies(plan, directory, [*files, *given])
    for result in report.rules if report else ():
        was = before.get((result.file, result.name))
        if was is not None and was != result.outcome:
            print_lines(
                [
                    f"Policy rule {result.name} ({result.file}) was {was} when the plan "
                    f"was saved, {result.outcome} now."
                ]
            )
    return report


def started_runs(plan) -> list[str]:  # noqa: ANN001 - Plan, imported lazily
    """The runs `apply --attach` follows: those the plan creates, replaces or updates (an
    unchanged dev environment never ends, and attaching to it would block for ever)."""
    from dstack_plan.config.kinds import RUN_KINDS
    from dstack_plan.plan.model import Action

    return [
        c.address
        for c in plan.changes
        if c.kind in RUN_KINDS and c.after is not None and c.action is not Action.NOOP
    ]


async def _confirm(destroy: bool) -> bool:
    from dstack_plan.cli.output import print_lines
    from dstack_plan.plan.lines import styled

    if destroy:
        print_lines(
            [
                "",
                (styled("Do you really want to destroy all resources?", "bold"),),
                "  dstack-plan will destroy all the resources shown above.",
                "  There is no undo. Only 'yes' will be accepted to confirm.",
                "",
            ]
        )
    else:
        print_lines(
            [
                "",
                (styled("Do you want to perform these actions?", "bold"),),
                "  dstack-plan will perform the actions described above.",
                "  Only 'yes' will be accepted to approve.",
                "",
            ]
        )
    try:
        import asyncio

        answer = await asyncio.to_thread(input, "  Enter a value: ")
    except EOFError:
        return False
    return answer.strip() == "yes"


def print_progress(address: str, message: str) -> None:
    """What a resource's handler says as it goes (a host taken over, an agent kept)."""
    _print_event(address, "progress", message)


def _print_event(address: str, phase: str, message: str) -> None:
    from dstack_plan.cli.output import print_lines
    from dstack_plan.plan.lines import styled

    color = {"failed": "red", "skipped": "yellow", "interrupt": "yellow", "abort": "red"}
    text = f"{address}: {message}" if address else message
    style = color.get(phase)
    print_lines([(styled(text, style),) if style else text], stderr=phase in ("failed", "abort"))


def _report_lines(report) -> list[Line]:  # noqa: ANN001 - ApplyReport, imported lazily
    from dstack_plan.plan.lines import styled

    lines: list[Line] = []
    # no `Error:` lines: each error was said once already, on stderr, as its resource failed
    for label, results in (
        (styled("Skipped:", "yellow"), report.skipped),
        (styled("Not started:", "yellow"), report.not_started),
    ):
        lines += [(label, f" {r.address}: {r.message}") for r in results]
    warning = report.abort_warning()
    if warning:
        lines.append((styled("Warning:", "red"), f" {warning}"))
    color = "green" if report.ok else "red"
    lines.append((styled(report.summary(), f"bold {color}"),))
    return lines
