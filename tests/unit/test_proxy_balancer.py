"""The proxy's balancer: least connections, ties round-robin, up/down, deterministic."""

from __future__ import annotations

from dstack_plan.proxy.balancer import Balancer


def up(*replicas: str) -> Balancer:
    balancer = Balancer(replicas)
    for replica in replicas:
        balancer.mark_up(replica)
    return balancer


def test_ties_go_round_robin() -> None:
    balancer = up("a", "b", "c")
    assert [balancer.pick() for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_least_connections_wins_over_the_turn() -> None:
    balancer = up("a", "b", "c")
    balancer.acquire("a")
    balancer.acquire("a")
    balancer.acquire("b")
    assert balancer.pick() == "c"
    balancer.acquire("c")
    assert balancer.pick() == "b"  # b and c hold one each; b comes first after the cursor
    balancer.release("a")
    balancer.release("a")
    assert balancer.pick() == "a"
    assert balancer.in_flight("a") == 0
    balancer.release("a")  # more releases than acquires do not go negative
    assert balancer.in_flight("a") == 0


def test_starts_down_and_follows_marks() -> None:
    balancer = Balancer(["a", "b"])
    assert balancer.pick() is None
    balancer.mark_up("b")
    assert [balancer.pick() for _ in range(3)] == ["b", "b", "b"]
    balancer.mark_up("a")
    balancer.mark_down("b")
    assert balancer.healthy() == ["a"]
    assert balancer.pick() == "a"
    balancer.mark_down("a")
    assert balancer.pick() is None
    balancer.mark_up("unknown")  # not a replica: ignored
    assert balancer.healthy() == []


def test_exclude() -> None:
    balancer = up("a", "b")
    assert balancer.pick(exclude={"a"}) == "b"
    assert balancer.pick(exclude={"a", "b"}) is None


def test_set_replicas_keeps_state_of_those_that_stay() -> None:
    balancer = up("a", "b")
    balancer.acquire("b")
    balancer.set_replicas(["b", "c"])
    assert balancer.replicas == ["b", "c"]
    assert balancer.healthy() == ["b"]  # c is new: down until its probes pass
    assert balancer.in_flight("b") == 1
    assert balancer.in_flight("a") == 0
    balancer.set_replicas([])
    assert balancer.pick() is None


def test_deterministic() -> None:
    def run() -> list[str | None]:
        balancer = up("a", "b", "c", "d")
        picks: list[str | None] = []
        for step in range(40):
            replica = balancer.pick()
            picks.append(replica)
            if replica is not None and step % 3 == 0:
                balancer.acquire(replica)
            if step % 5 == 0:
                balancer.release("a")
            if step == 20:
                balancer.mark_down("c")
        return picks

    assert run() == run()
    assert "c" not in run()[21:]
