"""A command's job listings (`fleets/listings.py`): each machine asked once while kept, kept
up to date with what the command does itself, asked again on `relist`, never kept outside a
command."""

from __future__ import annotations

import asyncio

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.errors import AgentError
from dstack_plan.fleets.listings import JobListings
from dstack_plan.providers.base import Instance

H1 = ("pool", "h1")
H2 = ("pool", "h2")


def info(job_id: str, run: str = "web", status: str = "running") -> JobInfo:
    return JobInfo(id=job_id, run_name=run, runtime="process", status=status, submitted_at=1.0)


class Agent:
    """An agent's job listing, counting how often it is asked."""

    def __init__(self, *jobs: JobInfo) -> None:
        self.jobs = list(jobs)
        self.asked = 0
        self.fail: AgentError | None = None

    async def list_jobs(self) -> list[JobInfo]:
        self.asked += 1
        await asyncio.sleep(0)  # others ask meanwhile
        if self.fail is not None:
            raise self.fail
        return list(self.jobs)


def ids(jobs: list[JobInfo]) -> list[str]:
    return [j.id for j in jobs]


def test_a_command_lists_each_machine_once_and_callers_share_the_listing() -> None:
    listings = JobListings()
    one, two = Agent(info("a"), info("b", run="db")), Agent(info("c"))

    async def command() -> list[list[str]]:
        with listings.kept():
            first = await asyncio.gather(*(listings.jobs(H1, one.list_jobs) for _ in range(10)))
            return [
                *(ids(j) for j in first),
                ids(await listings.jobs(H1, one.list_jobs, "db")),
                ids(await listings.jobs(H2, two.list_jobs)),
                ids(await listings.jobs(H2, two.list_jobs)),
            ]

    seen = asyncio.run(command())
    assert seen[:10] == [["a", "b"]] * 10
    assert seen[10:] == [["b"], ["c"], ["c"]]
    assert (one.asked, two.asked) == (1, 1)


def test_outside_a_command_every_question_asks_the_agent() -> None:
    listings = JobListings()
    agent = Agent(info("a"), info("b", run="db"))

    async def asked() -> list[str]:
        await listings.jobs(H1, agent.list_jobs)
        return ids(await listings.jobs(H1, agent.list_jobs, "db"))

    assert asyncio.run(asked()) == ["b"]
    assert agent.asked == 2
    assert not listings.active


def test_what_the_command_does_shows_in_its_listing() -> None:
    listings = JobListings()
    agent = Agent(info("a"), info("b"))

    async def command() -> tuple[list[str], list[str], str]:
        with listings.kept():
            await listings.jobs(H1, agent.list_jobs)
            listings.record(H1, [info("c"), info("a", status="terminating")])
            listings.forget(H1, ["b", "nope"])
            now = await listings.jobs(H1, agent.list_jobs)
            web = ids(await listings.jobs(H1, agent.list_jobs, "web"))
            return ids(now), web, now[0].status.value

    assert asyncio.run(command()) == (["a", "c"], ["a", "c"], "terminating")
    assert agent.asked == 1


def test_relist_asks_again_and_a_command_s_end_forgets_everything() -> None:
    listings = JobListings()
    agent = Agent(info("a"))

    async def command() -> list[str]:
        with listings.kept():
            with listings.kept():  # the plan inside the apply flow: one command
                await listings.jobs(H1, agent.list_jobs)
            agent.jobs.append(info("b"))
            assert ids(await listings.jobs(H1, agent.list_jobs)) == ["a"]
            listings.relist("pool")
            return ids(await listings.jobs(H1, agent.list_jobs))

    assert asyncio.run(command()) == ["a", "b"]
    assert agent.asked == 2
    listings.record(H1, [info("z")])  # outside a command: nothing is kept
    assert asyncio.run(listings.jobs(H1, agent.list_jobs)) == [info("a"), info("b")]


def test_a_machine_that_does_not_answer_is_asked_once_per_command() -> None:
    listings = JobListings()
    agent = Agent()
    agent.fail = AgentError("h1", "unreachable")

    async def command() -> int:
        failures = 0
        with listings.kept():
            for _ in range(3):
                try:
                    await listings.jobs(H1, agent.list_jobs)
                except AgentError:
                    failures += 1
        return failures

    assert asyncio.run(command()) == 3
    assert agent.asked == 1


def test_implicit_machines_are_refreshed_once_per_command() -> None:
    listings = JobListings()
    refreshed = 0

    async def refresh() -> list[Instance]:
        nonlocal refreshed
        refreshed += 1
        await asyncio.sleep(0)
        return []

    async def command() -> None:
        with listings.kept():
            await asyncio.gather(*(listings.implicit("local", refresh) for _ in range(10)))
        await listings.implicit("local", refresh)

    asyncio.run(command())
    assert refreshed == 2


@pytest.mark.parametrize("change", ["record", "forget"])
def test_a_change_while_the_listing_is_on_its_way_makes_the_next_caller_ask_again(
    change: str,
) -> None:
    listings = JobListings()
    agent = Agent(info("a"))

    async def command() -> list[str]:
        with listings.kept():
            pending = asyncio.ensure_future(listings.jobs(H1, agent.list_jobs))
            await asyncio.sleep(0)  # asked, not answered
            if change == "record":
                listings.record(H1, [info("b")])
            else:
                listings.forget(H1, ["a"])
            agent.jobs = [info("b")] if change == "record" else []
            await pending
            return ids(await listings.jobs(H1, agent.list_jobs))

    assert asyncio.run(command()) == (["b"] if change == "record" else [])
    assert agent.asked == 2


def test_a_listing_started_early_answers_the_first_question_without_asking_again() -> None:
    listings = JobListings()
    agent = Agent(info("a"), info("b", run="db"))

    async def command() -> tuple[int, list[str], list[str]]:
        with listings.kept():
            listings.start(H1, agent.list_jobs)
            listings.start(H1, agent.list_jobs)  # started once
            await asyncio.sleep(0)
            asked_before = agent.asked  # on its way before anyone asks
            return (
                asked_before,
                ids(await listings.jobs(H1, agent.list_jobs)),
                ids(await listings.jobs(H1, agent.list_jobs, "db")),
            )

    assert asyncio.run(command()) == (1, ["a", "b"], ["b"])
    assert agent.asked == 1


def test_starting_a_listing_outside_a_command_does_nothing() -> None:
    listings = JobListings()
    agent = Agent(info("a"))

    async def outside() -> None:
        listings.start(H1, agent.list_jobs)
        await asyncio.sleep(0.01)

    asyncio.run(outside())
    assert agent.asked == 0


def test_a_started_listing_that_fails_raises_to_its_asker_and_logs_nothing_unasked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listings = JobListings()
    asked, unasked = Agent(), Agent()
    asked.fail = AgentError("h1", "connection refused")
    unasked.fail = AgentError("h2", "connection refused")

    async def command() -> str:
        with listings.kept():
            listings.start(H1, asked.list_jobs)
            listings.start(H2, unasked.list_jobs)  # nobody asks about h2 afterwards
            await asyncio.sleep(0.01)
            try:
                await listings.jobs(H1, asked.list_jobs)
            except AgentError as e:
                return str(e)
            return "no error"

    with caplog.at_level("ERROR", logger="asyncio"):
        assert "connection refused" in asyncio.run(command())
        import gc

        gc.collect()
    assert "never retrieved" not in caplog.text
    assert asked.asked == 1
