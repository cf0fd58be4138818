"""Fair share with borrowing and reclaim (`dstack_plan.scheduler.fair_share`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.scheduler.fair_share import (
    Held,
    Tenant,
    admit,
    freed,
    gpu_amount,
    reclaim,
    resolve_gpus,
    usage,
)
from dstack_plan.scheduler.packing import HostState, Shape, fits

ONE = Shape(gpus=1)
TWO = Shape(gpus=2)


def host(*free: int, model: str = "A100") -> HostState:
    """A host's free GPUs by index (thousandths), CPU and memory aside."""
    return HostState(model, 0, 0, tuple(free))


def job(
    name: str,
    tenant: str,
    at: str,
    started: float,
    gpus: float = 1.0,
    indices: tuple[int, ...] = (),
    preemptible: bool = True,
) -> Held:
    if gpus < 1:
        shape = Shape(gpus=1, gpu_milli=round(gpus * WHOLE))
    else:
        shape = Shape(gpus=round(gpus))
    return Held(name, tenant, at, gpus, started, preemptible, shape, indices)


# --- guarantees ---------------------------------------------------------------------------


def test_guarantees_are_gpu_counts_or_percentages_of_the_capacity() -> None:
    assert resolve_gpus("50%", 16) == 8
    assert resolve_gpus(" 12.5% ", 16) == 2
    assert resolve_gpus("3", 16) == 3
    assert resolve_gpus(2.5, 16) == 2.5
    a = Tenant.of("a", "25%", 16, limit="50%")
    assert (a.guarantee_gpus, a.borrowing_limit) == (4, 8)
    assert Tenant.of("b", 4, 16).borrowing_limit is None


@pytest.mark.parametrize("bad", ["half", "-1", "-5%", "nan", "inf", "%"])
def test_a_guarantee_that_is_no_amount_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        resolve_gpus(bad, 16)


# --- admission ----------------------------------------------------------------------------

TENANTS = [Tenant("a", 4), Tenant("b", 4, borrowing_limit=2)]


def test_within_its_guarantee_a_tenant_is_admitted_whoever_waits() -> None:
    held = [job("a1", "a", "h1", 0, 2)]
    decision = admit("a", 2, TENANTS, held, 8, {"b": 4})
    assert decision.ok and not decision.borrowing
    assert "within guarantee" in decision.why


def test_a_tenant_borrows_idle_gpus_beyond_its_guarantee() -> None:
    held = [job(f"a{i}", "a", "h1", i) for i in range(4)]
    decision = admit("a", 3, TENANTS, held, 8, {})
    assert decision.ok and decision.borrowing
    assert decision.why == "borrows 3 idle GPUs"


def test_borrowing_stops_at_the_borrowing_limit() -> None:
    held = [job(f"b{i}", "b", "h1", i) for i in range(5)]  # 1 GPU borrowed already
    assert admit("b", 1, TENANTS, held, 16, {}).ok
    refused = admit("b", 2, TENANTS, held, 16, {})
    assert not refused.ok and refused.borrowing
    assert refused.why == "would borrow 3 GPUs, borrowing limit 2"


def test_nothing_is_admitted_beyond_the_free_gpus() -> None:
    held = [job("b1", "b", "h1", 0, 7)]
    refused = admit("a", 2, TENANTS, held, 8, {})
    assert not refused.ok and not refused.borrowing
    assert refused.why == "needs 2 GPUs, 1 free"


def test_no_borrowing_while_a_tenant_under_its_guarantee_waits() -> None:
    held = [job(f"a{i}", "a", "h1", i) for i in range(4)] + [job("b1", "b", "h2", 0)]
    refused = admit("a", 1, TENANTS, held, 8, {"b": 1})
    assert not refused.ok and refused.borrowing
    assert refused.why == "b is 3 GPUs under its guarantee and waits for 1 of them"
    # its own demand, a tenant at its guarantee, or nothing waiting: borrowing is fine
    assert admit("a", 1, TENANTS, held, 8, {"a": 5, "b": 0}).ok
    at_guarantee = held + [job(f"b{i}", "b", "h2", i) for i in range(2, 5)]
    assert admit("a", 1, TENANTS, at_guarantee, 9, {"b": 2}).ok


def test_a_tenant_without_an_entry_has_no_guarantee_and_no_limit() -> None:
    decision = admit("z", 3, TENANTS, [], 8, {})
    assert decision.ok and decision.borrowing


# --- reclaim ------------------------------------------------------------------------------

GUARANTEED = [Tenant("a", 4), Tenant("b", 4)]


def test_reclaim_takes_the_newest_borrowed_job() -> None:
    # b holds 6 (2 borrowed) on one 8-GPU host; a holds 2 and wants one more
    held = [job(f"b{i}", "b", "h1", float(i), indices=(i,)) for i in range(6)]
    held += [job("a0", "a", "h1", 0, indices=(6,)), job("a1", "a", "h1", 0, indices=(7,))]
    victims = reclaim("a", ONE, GUARANTEED, held, {"h1": host(0, 0, 0, 0, 0, 0, 0, 0)})
    assert [v.job for v in victims] == ["b5"]
    two = reclaim("a", TWO, GUARANTEED, held, {"h1": host(0, 0, 0, 0, 0, 0, 0, 0)})
    assert [v.job for v in two] == ["b5", "b4"]


def test_no_reclaim_for_a_tenant_at_or_above_its_guarantee() -> None:
    held = [job(f"b{i}", "b", "h1", float(i), indices=(i,)) for i in range(4)]
    held += [job(f"a{i}", "a", "h1", 0, indices=(4 + i,)) for i in range(4)]
    hosts = {"h1": host(*[0] * 8)}
    assert reclaim("a", ONE, GUARANTEED, held, hosts) == []  # a at its guarantee
    held.append(job("b4", "b", "h2", 9, indices=(0,)))
    hosts["h2"] = host(0)
    assert reclaim("a", ONE, GUARANTEED, held, hosts) == []  # still: b borrows, a does not


def test_no_reclaim_for_a_job_that_would_take_its_tenant_over_its_guarantee() -> None:
    held = [job(f"b{i}", "b", "h1", float(i), indices=(i,)) for i in range(6)]
    held += [job(f"a{i}", "a", "h1", 0, indices=(6 + i,)) for i in range(2)]
    hosts = {"h1": host(*[0] * 8)}
    assert reclaim("a", Shape(gpus=3), GUARANTEED, held, hosts) == []  # 2 + 3 > 4
    assert len(reclaim("a", TWO, GUARANTEED, held, hosts)) == 2


def test_reclaim_never_takes_a_victim_tenant_below_its_guarantee() -> None:
    # b is 0.5 over its guarantee: its whole-GPU jobs are safe, its half-GPU one is not
    held = [job(f"b{i}", "b", "h1", float(i), indices=(i,)) for i in range(4)]
    held.append(job("b-half", "b", "h1", 10, 0.5, indices=(4,)))
    held.append(job("a-half", "a", "h1", 0, 0.5, indices=(4,), preemptible=False))
    held += [job(f"a{i}", "a", "h1", 0, indices=(5 + i,)) for i in range(3)]
    hosts = {"h1": host(*[0] * 8)}
    assert reclaim("a", Shape(gpus=1, gpu_milli=500), GUARANTEED, held, hosts) == held[4:5]
    assert reclaim("a", ONE, GUARANTEED, held, hosts) == []  # a whole GPU takes b below


def test_reclaim_is_host_aware_the_job_fits_where_the_victims_leave() -> None:
    # h1: b's newest job shares a GPU with a job that stays, so it frees no whole GPU;
    # h2: b's older whole-GPU job does
    held = [
        job("b-new", "b", "h1", 50, 0.5, indices=(0,)),
        job("c-stays", "c", "h1", 1, 0.5, indices=(0,), preemptible=False),
        job("b-old", "b", "h2", 5, indices=(0,)),
    ]
    held += [job(f"b{i}", "b", "h3", float(i), indices=(i,)) for i in range(4)]
    held += [job(f"a{i}", "a", "h3", 0, indices=(4 + i,)) for i in range(2)]
    hosts = {"h1": host(0), "h2": host(0), "h3": host(*[0] * 6)}
    tenants = [*GUARANTEED, Tenant("c", 0)]
    victims = reclaim("a", ONE, tenants, held, hosts)
    assert [v.job for v in victims] == ["b-old"]
    after = freed(hosts["h2"], victims)
    assert fits(after, ONE)
    assert not fits(freed(hosts["h1"], [held[0]]), ONE)


def test_reclaim_prefers_the_host_with_fewest_victims() -> None:
    # h1 needs b's two newest half-GPU jobs, h2 one older whole-GPU job
    held = [
        job("b-h1-1", "b", "h1", 90, 0.5, indices=(0,)),
        job("b-h1-2", "b", "h1", 91, 0.5, indices=(0,)),
        job("b-h2", "b", "h2", 10, indices=(0,)),
    ]
    held += [job(f"b{i}", "b", "h3", float(i), indices=(i,)) for i in range(4)]
    hosts = {"h1": host(0), "h2": host(0), "h3": host(0, 0, 0, 0)}
    victims = reclaim("a", ONE, GUARANTEED, held, hosts)
    assert [v.job for v in victims] == ["b-h2"]


def test_between_equal_hosts_the_most_served_tenant_gives_first() -> None:
    """Newest first across tenants would always hit whoever borrowed last: between hosts
    that need as few victims, the tenant furthest above its guarantee (relative to it)
    loses the job, even an older one."""
    tenants = [Tenant("a", 4), Tenant("b", 4), Tenant("c", 2)]
    held = [job("b-new", "b", "h1", 90, indices=(0,)), job("c-old", "c", "h2", 10, indices=(0,))]
    held += [job(f"b{i}", "b", "h3", i, 1, (i,), preemptible=False) for i in range(4)]  # 5/4
    held += [job(f"c{i}", "c", "h4", i, 1, (i,), preemptible=False) for i in range(2)]  # 3/2
    hosts = {"h1": host(0), "h2": host(0), "h3": host(0, 0, 0, 0), "h4": host(0, 0)}
    victims = reclaim("a", ONE, tenants, held, hosts)
    assert [v.job for v in victims] == ["c-old"]
    # on one host, though, the newest goes first whoever it belongs to
    held[1] = job("c-old", "c", "h1", 10, indices=(1,))
    hosts = {"h1": host(0, 0), "h3": host(0, 0, 0, 0), "h4": host(0, 0)}
    assert [v.job for v in reclaim("a", ONE, tenants, held, hosts)] == ["b-new"]


def test_reclaim_keeps_only_the_victims_the_job_needs() -> None:
    # newest first, b's tiny job goes first but frees too little; it is then spared
    held = [
        job("b-tiny", "b", "h1", 99, 0.1, indices=(1,)),
        job("b-gpu0", "b", "h1", 50, indices=(0,)),
    ]
    held += [job(f"b{i}", "b", "h2", float(i), indices=(i,)) for i in range(4)]
    hosts = {"h1": host(0, 800), "h2": host(0, 0, 0, 0)}
    victims = reclaim("a", ONE, GUARANTEED, held, hosts)
    assert [v.job for v in victims] == ["b-gpu0"]


def test_a_reclaimed_job_may_not_borrow_again_while_the_claimant_waits() -> None:
    """No loop: the victim, back in its queue, is refused the borrowed GPUs while the
    tenant it was preempted for still waits within its guarantee; once that tenant is
    served, it borrows again."""
    held = [job(f"b{i}", "b", "h1", float(i), indices=(i,)) for i in range(6)]
    held += [job("a0", "a", "h1", 0, indices=(6,)), job("a1", "a", "h1", 0, indices=(7,))]
    hosts = {"h1": host(*[0] * 8)}
    victims = reclaim("a", TWO, GUARANTEED, held, hosts)
    assert [v.job for v in victims] == ["b5", "b4"]
    after = [h for h in held if h not in victims]
    # the victims left; a still waits (two GPUs under its guarantee): b may not borrow them
    waiting = {"a": 2.0}
    refused = admit("b", 1, GUARANTEED, after, 8, waiting)
    assert not refused.ok and refused.borrowing
    assert "a is 2 GPUs under its guarantee" in refused.why
    # a's job starts on the freed GPUs; b's job waits for idle GPUs, then borrows them
    served = after + [job("a2", "a", "h1", 100, 2, indices=(4, 5))]
    assert reclaim("a", ONE, GUARANTEED, served, hosts) == []
    assert not admit("b", 1, GUARANTEED, served, 8, {}).ok  # no GPU is idle
    assert admit("b", 1, GUARANTEED, served, 9, {}).ok  # one more GPU: it borrows it


def test_freed_gives_back_named_gpus_or_the_least_free_ones() -> None:
    free = HostState("A100", 1000, 2048, (0, 500, 1000, 0))
    named = freed(free, [job("x", "b", "h", 0, 0.5, indices=(1,))])
    assert named == HostState("A100", 1000, 2048, (1000, 1000, 0, 0))
    unnamed = freed(free, [Held("y", "b", "h", 1.0, 0)])
    assert unnamed.gpus == (1000, 1000, 500, 0)
    with_cpu = freed(free, [Held("z", "b", "h", 0.0, 0, shape=Shape(cpu=500, memory=10))])
    assert (with_cpu.cpu, with_cpu.memory) == (1500, 2058)


def test_usage_and_gpu_amounts() -> None:
    held = [job("a", "a", "h", 0, 0.25), job("b", "a", "h", 0, 2), job("c", "b", "h", 0)]
    assert usage(held) == {"a": 2.25, "b": 1.0}
    assert gpu_amount(Shape(gpus=1, gpu_milli=470)) == 0.47
    assert gpu_amount(Shape(gpus=4)) == 4
    assert gpu_amount(Shape(cpu=4000)) == 0


# --- properties ---------------------------------------------------------------------------

NAMES = ("a", "b", "c")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Tenant], list[Held], dict[str, HostState], Shape]:
    """Hosts of 1-4 GPUs filled with whole-GPU and shared jobs of three tenants (each on
    the GPUs the agent's rule would give it), guarantees that sum to at most the
    capacity, and a job that one tenant wants."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    free = {f"h{i}": [WHOLE] * n for i, n in enumerate(sizes)}
    held: list[Held] = []
    for number in range(draw(st.integers(0, 24))):
        name = draw(st.sampled_from(sorted(free)))
        gpus = free[name]
        if draw(st.booleans()):
            want = draw(st.integers(1, len(gpus)))
            whole = [i for i, f in enumerate(gpus) if f == WHOLE][:want]
            if len(whole) < want:
                continue
            taken, shape = tuple(whole), Shape(gpus=want)
        else:
            share = draw(st.sampled_from((100, 250, 470, 500, 810)))
            fitting = [(f, i) for i, f in enumerate(gpus) if f >= share]
            if not fitting:
                continue
            taken, shape = (min(fitting)[1],), Shape(gpus=1, gpu_milli=share)
        for i in taken:
            gpus[i] -= min(shape.gpu_milli, WHOLE)
        held.append(
            Held(
                f"j{number}",
                draw(st.sampled_from(NAMES)),
                name,
                gpu_amount(shape),
                float(draw(st.integers(0, 1000))),
                draw(st.booleans()) or draw(st.booleans()),  # mostly preemptible
                shape,
                taken,
            )
        )
    capacity = sum(sizes)
    weights = draw(st.lists(st.integers(0, 10), min_size=3, max_size=3))
    total = sum(weights) or 1
    tenants = [Tenant(n, capacity * w / total) for n, w in zip(NAMES, weights, strict=True)]
    hosts = {name: HostState("A100", 0, 0, tuple(gpus)) for name, gpus in free.items()}
    wanted = draw(
        st.one_of(
            st.integers(1, 4).map(lambda n: Shape(gpus=n)),
            st.sampled_from((100, 250, 500, 810)).map(lambda m: Shape(gpus=1, gpu_milli=m)),
        )
    )
    return tenants, held, hosts, wanted


@settings(max_examples=400)  # about one example in 16 has victims
@given(clusters(), st.sampled_from(NAMES))
def test_after_reclaim_the_job_fits_and_no_victim_tenant_drops_below_its_guarantee(
    cluster: tuple[list[Tenant], list[Held], dict[str, HostState], Shape], claimant: str
) -> None:
    tenants, held, hosts, wanted = cluster
    victims = reclaim(claimant, wanted, tenants, held, hosts)
    if not victims:
        return
    guarantee = {t.name: t.guarantee_gpus for t in tenants}
    before = usage(held)
    # the claimant was under its guarantee and stays within it with the job
    assert before.get(claimant, 0.0) + gpu_amount(wanted) <= guarantee[claimant] + 1e-9
    # one host, preemptible jobs of others, and the job fits there once they left
    assert len({v.host for v in victims}) == 1
    assert all(v.preemptible and v.tenant != claimant for v in victims)
    assert len({v.job for v in victims}) == len(victims)
    where = victims[0].host
    assert fits(freed(hosts[where], victims), wanted)
    # no victim tenant goes below its guarantee
    after = usage([h for h in held if h not in victims])
    for name in {v.tenant for v in victims}:
        assert after.get(name, 0.0) >= guarantee[name] - 1e-9
        assert before[name] > guarantee[name]
    # none is spare: without any one of them the job does not fit
    for victim in victims:
        fewer = [v for v in victims if v is not victim]
        assert not fits(freed(hosts[where], fewer), wanted)


@given(clusters(), st.sampled_from(NAMES), st.floats(0, 4))
def test_admission_never_passes_the_capacity_or_the_borrowing_limit(
    cluster: tuple[list[Tenant], list[Held], dict[str, HostState], Shape],
    tenant: str,
    gpus: float,
) -> None:
    tenants, held, hosts, _ = cluster
    capacity = sum(len(h.gpus) for h in hosts.values())
    limited = [Tenant(t.name, t.guarantee_gpus, borrowing_limit=1.0) for t in tenants]
    used = usage(held)
    decision = admit(tenant, gpus, limited, held, capacity, {})
    if decision.ok:
        assert sum(used.values()) + gpus <= capacity + 1e-9
        mine = next(t for t in limited if t.name == tenant)
        assert used.get(tenant, 0.0) + gpus <= mine.guarantee_gpus + 1.0 + 1e-9
        assert decision.borrowing == (used.get(tenant, 0.0) + gpus > mine.guarantee_gpus + 1e-9)
    assert math.isfinite(gpus)
