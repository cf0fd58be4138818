"""Labels and data locality: which machines a run may use, and which it prefers. Pure.

A machine carries the labels its fleet's host entry gives (`rack`, `zone`, `near`, anything
else) and one built in: `gpu.model`, the normalised model of its GPUs (`A100` for `NVIDIA
A100-SXM4-80GB`), so a run can pin a model without the `resources:` grammar. A run's
`labels:` are a requirement: a machine lacking one is excluded, and the decision says so when
the run cannot be placed. Its `near:` is a preference: the machines labelled near that storage
are tried first, the others still take the run when they cannot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from dstack_plan.config.gpu_names import normalise_gpu_name
from dstack_plan.config.labels import GPU_MODEL, NEAR
from dstack_plan.config.runs import RunSpec
from dstack_plan.providers.base import MachineResources
from dstack_plan.scheduler.placement import Candidate, Decision

LABELS = "labels"
"""`Decision.blocked_by` for a run no machine has the labels for."""

Labels = Mapping[str, tuple[str, ...]]
"""A machine's labels: each key with the values it carries (a `near` label may list several)."""

_VENDOR_WORDS = frozenset({"NVIDIA", "AMD", "INTEL", "TESLA", "GEFORCE", "QUADRO", "INSTINCT"})


class Wants(NamedTuple):
    """What a run asks of the labels of its machines."""

    required: Mapping[str, str] = {}
    near: str | None = None

    @classmethod
    def of(cls, spec: RunSpec) -> Wants:
        return cls(dict(spec.labels or {}), spec.near)

    @property
    def empty(self) -> bool:
        return not self.required and self.near is None


def gpu_model(name: str) -> str:
    """The normalised model of a GPU as nvidia-smi / amd-smi name it: `NVIDIA A100-SXM4-80GB`
    -> `A100`, `NVIDIA GeForce RTX 4090` -> `RTX4090`, `AMD Instinct MI300X` -> `MI300X`: the
    GPU-name table's spelling (what `resources.gpu` names match), else its first word."""
    known = normalise_gpu_name(name).model
    if known is not None:
        return known
    # a name the table lacks: its first word past the brand ones (`NVIDIA Fake A1` -> `FAKE`)
    tokens = [t for t in re.split(r"[\s\-_]+", name.upper()) if t and t not in _VENDOR_WORDS]
    return tokens[0] if tokens else name.strip().upper()


def machine_labels(resources: MachineResources, given: Mapping[str, tuple[str, ...]]) -> Labels:
    """A machine's labels: those its host entry `given`, and `gpu.model` when it has GPUs."""
    models = tuple(sorted({gpu_model(g.name) for g in resources.gpus}))
    return {**given, GPU_MODEL: models} if models else dict(given)


def lacks(wants: Wants, labels: Labels) -> str | None:
    """`lacks label rack=r1 (has rack=r2)`: why a machine with `labels` may not take the run;
    None when it carries every label the run requires."""
    missing = []
    for key, value in wants.required.items():
        has = labels.get(key, ())
        if not any(_same(key, value, h) for h in has):
            found = f"has {key}={','.join(has)}" if has else f"no {key} label"
            missing.append(f"{key}={value} ({found})")
    if not missing:
        return None
    plural = "s" if len(missing) > 1 else ""
    return f"lacks label{plural} {' and '.join(missing)}"


def is_near(wants: Wants, labels: Labels) -> bool:
    """Whether the machine is labelled near the storage the run prefers."""
    return wants.near is not None and wants.near in labels.get(NEAR, ())


def choose(
    place_on: Callable[[Sequence[Candidate]], Decision],
    candidates: Sequence[Candidate],
    wants: Wants,
    labels: Mapping[str, Labels],
) -> Decision:
    """The decision of `place_on` among the `candidates` that carry the labels the run
    requires (`labels`: each candidate's, by host name), trying those near its storage first.

    A run no candidate has the labels for is never placed, with why per candidate; one the
    eligible candidates cannot take says, besides why, which candidates lack its labels.
    """
    if wants.empty:
        return place_on(candidates)
    eligible: list[Candidate] = []
    excluded: list[str] = []
    for candidate in candidates:
        why = lacks(wants, labels.get(candidate.host, {}))
        if why is None:
            eligible.append(candidate)
        else:
            excluded.append(f"{candidate.label}: {why}")
    if not eligible:
        return Decision(reason="; ".join(excluded), blocked_by=frozenset({LABELS}))
    near = [c for c in eligible if is_near(wants, labels.get(c.host, {}))]
    if near and len(near) < len(eligible):
        # a preference whatever the placement policy weighs: near machines alone first
        preferred = place_on(near)
        if preferred.placed:
            return preferred
        first = {c.host for c in near}
        eligible = near + [c for c in eligible if c.host not in first]
    decision = place_on(eligible)
    if decision.placed or not excluded:
        return decision
    blocked = decision.blocked_by if decision.pending else decision.blocked_by | {LABELS}
    return decision._replace(
        reason=f"{decision.reason}; {'; '.join(excluded)}", blocked_by=blocked
    )


def _same(key: str, wanted: str, has: str) -> bool:
    # a GPU model is compared as `resources.gpu` names are: case does not matter
    return wanted.upper() == has.upper() if key == GPU_MODEL else wanted == has
