"""Compare a resource's state spec with its desired spec."""

from __future__ import annotations

from typing import Any, NamedTuple

from dstack_plan.plan.kinds import ignored_paths, is_in_place, is_rolling
from dstack_plan.plan.normalize import flatten, get_path, with_path


class SpecDiff(NamedTuple):
    changed: tuple[str, ...]
    """Dotted paths whose values differ (ignored paths excluded)."""
    forces_replacement: tuple[str, ...]
    """The changed paths that cannot be updated in place."""
    after: dict[str, Any]
    """The desired spec with ignored paths kept at their state values."""

    @property
    def empty(self) -> bool:
        return not self.changed


def diff_specs(kind: str, before: dict[str, Any], after: dict[str, Any]) -> SpecDiff:
    """What changed from `before` to `after`, leaving out the desired spec's
    `lifecycle.ignore_changes` paths (kept at their `before` values)."""
    if before == after:  # most resources of a plan: nothing to walk
        return SpecDiff((), (), after)
    ignore = ignored_paths(after)
    flat_before = flatten(before)
    flat_after = flatten(after)
    paths = sorted(set(flat_before) | set(flat_after))
    changed = [p for p in paths if flat_before.get(p) != flat_after.get(p)]
    kept = after
    for path in list(changed):
        ignored = next((i for i in ignore if path == i or path.startswith(i + ".")), None)
        if ignored is not None:
            kept = with_path(kept, ignored, get_path(before, ignored))
            changed.remove(path)
    # An emptied mapping flattens to a leaf under its parent path; collapse duplicates.
    changed = [p for p in changed if not any(p != q and p.startswith(q + ".") for q in changed)]
    forcing = [p for p in changed if not _updatable(kind, p, before, after)]
    return SpecDiff(tuple(changed), tuple(forcing), kept)


def _updatable(kind: str, path: str, before: dict[str, Any], after: dict[str, Any]) -> bool:
    if kind == "fleet" and path == "ssh_config.hosts":
        return _only_hosts_added_or_removed(
            _hosts_by_endpoint(get_path(before, "ssh_config")),
            _hosts_by_endpoint(get_path(after, "ssh_config")),
        )
    if is_rolling(kind, path):
        # a new replica starts beside the old one: only a container's port is mapped to a
        # free host port; a job without an image binds the port on the host itself
        return bool(before.get("image")) and bool(after.get("image"))
    return is_in_place(kind, path)


def _hosts_by_endpoint(ssh: Any) -> dict[tuple[Any, Any], Any]:
    """An SSH config's hosts by (hostname, port): one address may serve several hosts."""
    if not isinstance(ssh, dict):
        return {}
    port = ssh.get("port", 22)
    hosts = [h for h in ssh.get("hosts") or [] if isinstance(h, dict)]
    return {(h.get("hostname"), h.get("port") or port): h for h in hosts}


def _only_hosts_added_or_removed(old: dict[Any, Any], new: dict[Any, Any]) -> bool:
    """SSH fleet hosts may come and go in place; changing a kept host's settings may not,
    except its `labels` (they only steer placement: no host is touched)."""
    return all(_unlabelled(old[key]) == _unlabelled(new[key]) for key in old.keys() & new.keys())


def _unlabelled(host: Any) -> Any:
    return {k: v for k, v in host.items() if k != "labels"} if isinstance(host, dict) else host
